"""Where a report or diff goes: a directory of its own, checked before anything is drawn."""

from __future__ import annotations

from pathlib import Path

from microbench.atomic import not_an_input
from microbench.errors import UsageError

FIGURES = "figures"
"""The subdirectory of a report or diff that holds its figures."""


def output_dir(out: str, inputs: list[str], files: tuple[str, ...]) -> Path:
    """--out as a directory to write into: not empty, not a file, and neither an input nor inside one (a run's
    points/, which every reader of the run reads); a new directory just inside an input (RUN/report) is fine. The
    `files` it will hold, and figures/, must be able to take what is written there, so that a refusal comes before
    anything is written, not after half of it."""
    if not out:
        raise UsageError("--out is empty: give a directory to write into")
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {out}: exists and is not a directory")
    not_an_input(out, inputs)
    for name in files:
        if (path / name).is_dir():
            raise UsageError(f"--out {out}: {path / name} is a directory: remove it or choose another --out")
    if (path / FIGURES).exists() and not (path / FIGURES).is_dir():
        raise UsageError(f"--out {out}: {path / FIGURES} is not a directory: remove it or choose another --out")
    return path
