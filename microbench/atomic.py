"""Write files so that a reader (or a resumed run) never sees them half written."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from microbench.errors import UsageError
from microbench.jsonfile import input_path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Call write(tmp_path) on a temporary file beside `path`, fsync it, then rename it over `path`, with the mode a
    plain open() would give (the umask's). A symbolic link is written through (its target replaced, the link kept); a
    device or pipe (/dev/null) is written to directly, never replaced by a file. A path that cannot take a file (a
    directory, a place the system refuses, a full disk, a link loop) is one UsageError line."""
    given = Path(path)
    if str(path).endswith(("/", os.sep)):       # Path() drops the slash that says "a directory"
        raise UsageError(f"{path} names a directory: give a file name to write")
    path = Path(os.path.realpath(given))
    if path.is_dir():
        raise UsageError(f"{given} is a directory: give a file name to write")
    if path.is_symlink():
        raise UsageError(f"{given}: cannot write (a loop of symbolic links)")
    try:
        special = path.exists() and not path.is_file()
        if special:
            write(str(path))
            return given
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise UsageError(f"{given}: cannot write ({exc.strerror or exc})") from None
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise UsageError(f"{given}: cannot write ({exc.strerror or exc})") from None
        raise
    return given


def not_an_input(out: str | os.PathLike, inputs) -> None:
    """UsageError where writing `out` would replace what a command reads: one of `inputs` (files), a file already
    inside one (run directories), or a new file in one's subdirectories (a run's points/, which every reader of the
    run reads)."""
    target = Path(os.path.realpath(out))
    for given in inputs:
        source = Path(os.path.realpath(input_path(given)))
        inside = source.is_dir() and source in target.parents
        if target == source or (inside and (target.exists() or target.parent != source)):
            raise UsageError(f"--out {out} would overwrite the input {given}, or write into it; choose another path")


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)

    return atomic_write(path, write)


def atomic_write_json(path: str | os.PathLike, obj: object) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
