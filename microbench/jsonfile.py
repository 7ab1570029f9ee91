"""Read a JSON file a user hands us: a missing or unreadable file, or text that is not JSON (NaN and Infinity
included, which no writer of ours produces), is one UsageError line naming the file and what it should be."""

from __future__ import annotations

import json
from pathlib import Path

from microbench.errors import UsageError


def _reject_constant(name: str):
    raise ValueError(f"non-finite number {name}")


def read_json(path, what: str, shown=None):
    """The parsed JSON of `path`, a file holding a `what` (e.g. "calibration"); `shown`: the name errors give it
    (default the path)."""
    p, shown = Path(path), path if shown is None else shown
    try:
        text = p.read_text()
    except OSError as exc:
        raise UsageError(f"{shown}: cannot read {what} ({exc.strerror or exc})") from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise UsageError(f"{shown}: not valid JSON ({exc})") from None
