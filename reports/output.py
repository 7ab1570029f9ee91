"""Where a report or diff goes: a directory of its own, checked before anything is drawn."""

from __future__ import annotations

from pathlib import Path

from microbench.atomic import not_an_input
from microbench.errors import UsageError


def output_dir(out: str, inputs: list[str]) -> Path:
    """--out as a directory to write into: not empty, not a file, and neither an input nor inside one (a run's
    points/, which every reader of the run reads); a new directory just inside an input (RUN/report) is fine."""
    if not out:
        raise UsageError("--out is empty: give a directory to write into")
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {out}: exists and is not a directory")
    not_an_input(out, inputs)
    return path
