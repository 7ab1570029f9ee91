"""The thread level MPI is initialised with: commcal's choice, the lowest the work needs.

mpi4py initialises MPI with MPI_THREAD_MULTIPLE unless told otherwise, and with Open MPI that level costs every
small call its locks: on 2 local ranks 17-19% of an 8 B ping-pong or allreduce (issue 33). No commcal
subcommand calls MPI from more than one thread, so a sweep or validate on host buffers asks for 'single'; the
GPU backends ask for 'funneled', since CUDA and NCCL start threads of their own (none of which calls MPI).
The user's choice wins: `--thread-level`, else MPI4PY_RC_THREAD_LEVEL (mpi4py's own variable). Call choose()
before the first `from mpi4py import MPI` of the process; record() says what MPI provided."""

from __future__ import annotations

import os
import sys

from microbench.errors import UsageError

LEVELS = ("single", "funneled", "serialized", "multiple")
"""MPI_THREAD_SINGLE .. MPI_THREAD_MULTIPLE, in order (their values 0..3 in every MPI library)."""
ENV = "MPI4PY_RC_THREAD_LEVEL"
GPU_BACKENDS = ("mpi-cuda", "nccl")


def needed(backend: str = "mpi") -> tuple[str, str]:
    """The lowest level the work needs on `backend`, and why."""
    if backend in GPU_BACKENDS:
        return "funneled", f"--backend {backend}: CUDA and NCCL run threads of their own; only the main thread calls MPI"
    return "single", "one thread calls MPI"


def resolve(option: str | None, backend: str = "mpi", environ=os.environ) -> tuple[str, str]:
    """(level, who chose it): --thread-level, else MPI4PY_RC_THREAD_LEVEL, else what the work needs."""
    if option:
        return _check(option, "--thread-level"), "--thread-level"
    if environ.get(ENV):
        return _check(environ[ENV].strip().lower(), ENV), ENV
    level, why = needed(backend)
    return level, f"commcal ({why})"


def _check(level: str, where: str) -> str:
    if level not in LEVELS:
        raise UsageError(f"{where} {level!r} is not a thread level; choose from {', '.join(LEVELS)}")
    return level


def choose(option: str | None, backend: str = "mpi") -> dict:
    """Have mpi4py initialise MPI at the level resolve() picks (both rc and the variable, since mpi4py lets the
    variable override rc); returns run.json's record so far. Where MPI was initialised before (a benchmark or test
    importing mpi4py.MPI first), nothing can change: the record says so."""
    level, by = resolve(option, backend)
    if "mpi4py.MPI" in sys.modules:
        return {"requested": "unknown", "chosen_by": "MPI was initialised before commcal chose"}
    import mpi4py

    mpi4py.rc.thread_level = level
    os.environ[ENV] = level
    return {"requested": level, "chosen_by": by}


def provided_name(value: int) -> str:
    return LEVELS[value] if 0 <= value < len(LEVELS) else str(value)


def record(chosen: dict) -> dict:
    """`chosen` (choose()'s) with what MPI provided (MPI_Query_thread): run.json's mpi_thread_level."""
    from mpi4py import MPI

    return dict(chosen, provided=provided_name(MPI.Query_thread()))
