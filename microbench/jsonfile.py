"""Read a JSON (or plain text) file a user hands us: a missing or unreadable file, or text that is not JSON (NaN and
Infinity included where the file's writer never writes them; integers beyond a float's range; bytes that are not UTF-8;
nesting too deep to parse), is one UsageError line naming the file and what it should be."""

from __future__ import annotations

import json
import math
from pathlib import Path

from microbench.errors import UsageError
from microbench.limits import MAX_FILE_BYTES


def strict_json(obj, **kwargs) -> str:
    """json.dumps for output other programs parse: NaN and infinities (a prediction beyond the floats' range, a
    statistic without a value) become null, which JSON has, where json.dumps writes NaN and Infinity, which it lacks."""
    def clean(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v
    return json.dumps(clean(obj), allow_nan=False, **kwargs)


def _reject_constant(name: str):
    raise ValueError(f"non-finite number {name}")


def _bounded_int(text: str) -> int:
    """A JSON integer as Python reads it, unless more digits than a float's range (1e308) holds."""
    if len(text.lstrip("-")) > 308:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits")
    return int(text)


DIRECTORY_KINDS = {"strategies.parquet": "a validation directory", "run.json": "a sweep run directory",
                   "scan.json": "a scan directory"}
"""What a directory of ours is, by the first of these files it holds (a validation keeps a run.json of its own)."""


def directory_kind(path) -> str | None:
    """'a sweep run directory' or 'a scan directory' where `path` is one (by its provenance file), else None."""
    p = Path(path)
    return next((kind for name, kind in DIRECTORY_KINDS.items() if (p / name).is_file()), None)


def input_path(path) -> Path:
    """`path` as a Path; an empty one is a UsageError (Path("") would read the working directory)."""
    if not str(path):
        raise UsageError("an input path is empty: give the file or directory to read")
    return Path(path)


def _read_bytes(p: Path, what: str, shown, kind: str) -> bytes:
    """The bytes of `p`, at most MAX_FILE_BYTES of `kind` ("JSON", "text"); a directory, an unreadable file or more
    is one UsageError line."""
    try:
        with open(p, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        if p.is_dir():
            raise UsageError(f"{shown}: {directory_kind(p) or 'a directory'}, not a {what}") from None
        raise UsageError(f"{shown}: cannot read {what} ({exc.strerror or exc})") from None
    if len(raw) > MAX_FILE_BYTES:
        raise UsageError(f"{shown}: not a {what}: more than {MAX_FILE_BYTES >> 20} MiB of {kind}")
    return raw


def _decode(raw: bytes, what: str, shown) -> str:
    """`raw` as UTF-8 text; other bytes are one UsageError line."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{shown}: not a {what}: not UTF-8 text (byte {exc.start})") from None


def read_text(path, what: str, shown=None) -> str:
    """The text of `path`, a file holding a `what` (e.g. "topology file"); `shown`: the name errors give it (default
    the path). A missing, unreadable or oversized file, or bytes that are not UTF-8, are one UsageError line."""
    p, shown = input_path(path), path if shown is None else shown
    return _decode(_read_bytes(p, what, shown, "text"), what, shown)


def read_json(path, what: str, shown=None, finite: bool = True):
    """The parsed JSON of `path`, a file holding a `what` (e.g. "calibration"); `shown`: the name errors give it
    (default the path); finite=False reads NaN and Infinity too (a run's records hold NaN where a statistic has no
    value)."""
    p, shown = input_path(path), path if shown is None else shown
    text = _decode(_read_bytes(p, what, shown, "JSON"), what, shown)
    try:
        return json.loads(text, parse_int=_bounded_int, **({"parse_constant": _reject_constant} if finite else {}))
    except ValueError as exc:
        raise UsageError(f"{shown}: not valid JSON ({exc})") from None
    except RecursionError:
        raise UsageError(f"{shown}: not a {what}: JSON nested too deeply to read") from None
