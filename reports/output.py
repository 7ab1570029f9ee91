"""Report files: written atomically, then given the permissions the umask allows (a report is meant to be shared,
and the temporary file atomic_write renames is private)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from microbench.atomic import atomic_write


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def publish(path: Path, write: Callable[[str], None]) -> Path:
    def write_shared(tmp: str) -> None:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())

    return atomic_write(path, write_shared)


def publish_text(path: Path, text: str) -> Path:
    def write(tmp: str) -> None:
        Path(tmp).write_text(text, encoding="utf-8")

    return publish(path, write)
