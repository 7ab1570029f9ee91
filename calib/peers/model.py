"""What a peer log says, as values: one PeerPoint per measured row, already in commcal's operation names and size
convention (microbench.records), and the PeerLog around them with the peer's own provenance."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from microbench.methods import METHODS
from microbench.errors import UsageError
from microbench.limits import MAX_COUNT

ITEMSIZE = {"int8": 1, "uint8": 1, "float16": 2, "bfloat16": 2, "int32": 4, "uint32": 4, "float32": 4,
            "int64": 8, "uint64": 8, "float64": 8, "fp8_e4m3": 1, "fp8_e5m2": 1}
"""Bytes per element of the element types peers report, by commcal's (numpy's) name."""


@dataclass(frozen=True)
class PeerPoint:
    """One row of a peer's table. `seconds` is the peer's statistic (PeerLog.statistic says which); `samples` holds
    per-iteration times where the log has them (nccl-tests -I), else it is empty."""

    op: str
    procs: int
    size_bytes: int          # commcal's convention, converted from the peer's
    dtype: str
    seconds: float
    line: int                # where in the log, for messages
    samples: tuple[float, ...] = ()
    wrong: int = 0


@dataclass(frozen=True)
class PeerLog:
    """One log file: its points and where they came from. `method` names how the peer times (runs of different
    methods fit together only when asked); `hosts` lists each rank's host where the log names them."""

    path: str
    peer: str                # "nccl-tests", "osu", "imb"
    version: str
    command_line: str        # "" where the log does not record it
    method: str              # "nccl-tests", "osu", "osu-window", "imb"
    statistic: str           # what PeerPoint.seconds is, in words
    backend: str             # commcal backend: "mpi", "mpi-cuda", "nccl"
    points: tuple[PeerPoint, ...]
    hosts: tuple[str, ...] = ()
    world: int | None = None  # ranks in the job, where the log says
    date: str = ""
    skipped: tuple[str, ...] = ()   # what of the log was left out and why, one line each


@dataclass(frozen=True)
class Job:
    """What the caller knows about the job that a log may not say: its process count (OSU does not record it)
    and which half of an nccl-tests row to read (out-of-place unless in_place)."""

    world: int | None = None
    in_place: bool = False


def fail(path: str | Path, line: int, message: str) -> UsageError:
    """The one-line error for a log commcal cannot read: 'FILE:LINE: message' (no line number for 0)."""
    return UsageError(f"{path}:{line}: {message}" if line else f"{path}: {message}")


def number(path: str | Path, line: int, text: str, what: str, least: str = ">= 0") -> float:
    """A finite number from a log cell, non-negative (least ">= 0") or positive ("> 0": a time or a rate, which a
    size is divided by), or the one-line error naming the cell."""
    try:
        value = float(text)
    except ValueError:
        raise fail(path, line, f"{what} {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0 or (least == "> 0" and value == 0):
        raise fail(path, line, f"{what} {text!r} is not a finite number {least}")
    return value


def whole(path: str | Path, line: int, text: str, what: str) -> int:
    """A non-negative integer a reader can hold (up to MAX_COUNT) from a log cell, or the one-line error naming the
    cell."""
    if not (text.isascii() and text.isdigit()):
        raise fail(path, line, f"{what} {text!r} is not a whole number")
    if len(text) > len(str(MAX_COUNT)) or int(text) > MAX_COUNT:   # length first: int() refuses 4300 digits
        raise fail(path, line, f"{what} {text} is too large (at most {MAX_COUNT})")
    return int(text)


"""Operations whose size OSU and IMB give per rank (each rank's contribution; alltoall: to each peer) where commcal,
as nccl-tests, counts the whole gathered or sent buffer of p blocks."""


def mpi_total_bytes(op: str, size: int, procs: int, peer: str = "osu") -> int:
    """An OSU or IMB size in commcal's convention (the reference modes' rule, microbench.methods)."""
    return METHODS[peer].commcal_bytes(op, size, procs)
