"""Sweep runs as the report reads them: provenance and measured points of one or more run directories."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from microbench.errors import UsageError
from microbench.ops import OPS, known_dtype
from microbench.links import is_link
from microbench.records import (as_numbers, byte_sizes, load_summary, points_note, positive, read_run_json,
                               screen, whole)
from microbench.limits import MAX_BYTES
from microbench.provenance import recorded_sharing, sharing_text

NEEDED = ("run_id", "point_id", "backend", "op", "link", "procs", "dtype", "size_bytes", "median_s")
CI = ("ci_low_s", "ci_high_s")
"""The median's confidence interval: drawn as error bars where the summary has one."""
DRAWN_S = (1e-15, 1e15)
"""The times a figure draws: a log axis holds them without overflowing matplotlib's transforms, and every time a sweep
can measure (a timer's tick to years) lies far inside."""
CURVE_KEYS = ("backend", "op", "link", "procs", "dtype")
"""One measured curve (latency against size) per distinct value of these columns."""


@dataclass(frozen=True)
class Run:
    path: Path
    meta: dict


@dataclass(frozen=True)
class RunSet:
    """The runs a report covers and their drawable summary rows, concatenated, sorted by curve and size; `notes`
    says, one line each, what the figures leave out or draw without error bars, and why."""

    runs: tuple[Run, ...]
    summary: pd.DataFrame
    notes: tuple[str, ...] = ()

    def op_links(self) -> list[tuple[str, str]]:
        """(op, link) pairs measured, in first-seen order of the sorted summary."""
        return list(dict.fromkeys(zip(self.summary["op"], self.summary["link"])))

    def curves(self, op: str, link: str) -> list[tuple[dict, pd.DataFrame]]:
        """Each measured curve of one op over one link class: (its key values, its rows by size)."""
        rows = self.summary[(self.summary["op"] == op) & (self.summary["link"] == link)]
        return [(dict(zip(CURVE_KEYS, key)), part.sort_values("size_bytes"))
                for key, part in rows.groupby(list(CURVE_KEYS), sort=True)]


def drawable(frame: pd.DataFrame, where) -> tuple[pd.DataFrame, list[str]]:
    """The rows a figure can draw (numbers where the format has numbers, a known operation, link class and dtype),
    with both ends of every CI that is not a positive interval around its median made NaN (no error bar); and what
    was left out or drawn without error bars, one line each."""
    has_ci = all(col in frame for col in CI)
    notes = [] if has_ci else [f"{where}: the summary has no {' or '.join(CI)}: its points are drawn without "
                               f"error bars"]
    frame = as_numbers(frame if has_ci else frame.assign(**dict.fromkeys(CI, np.nan)),
                       ("procs", "size_bytes", "median_s", *CI))
    named = frame[["backend", "dtype"]].map(lambda v: isinstance(v, str)).all(axis=1)
    frame, left_out = screen(frame, [
        ("not a known operation", frame["op"].isin(list(OPS))),
        ("not a link class", frame["link"].map(is_link)),
        ("no backend or dtype", named),
        ("a dtype of unknown size", (frame["op"] != "gemm") | frame["dtype"].map(known_dtype)),
        ("a process count that is not a whole number >= 1", whole(frame["procs"], 1)),
        (f"a size that is not a positive number of bytes up to {MAX_BYTES:g}", byte_sizes(frame["size_bytes"])),
        ("a median that is not a positive number of seconds", positive(frame["median_s"])),
        (f"a median outside the times a figure draws ({DRAWN_S[0]:g} to {DRAWN_S[1]:g} s)",
         frame["median_s"].between(*DRAWN_S))], where)
    lo, hi, median = (frame[col] for col in (*CI, "median_s"))
    valid = positive(lo) & (lo <= median) & (median <= hi) & positive(hi)
    missing = lo.isna() & hi.isna()
    for rows, why in ((missing, "no confidence interval (too few samples for one, or none recorded)"),
                      (~valid & ~missing, "a confidence interval that is not a positive interval around the median")):
        if has_ci and rows.any():
            left_out.append(points_note(where, frame, rows, f"drawn without error bars, {why}"))
    frame = frame.assign(ci_low_s=lo.where(valid), ci_high_s=hi.where(valid))
    return frame.astype({"procs": "int64", "size_bytes": "int64"}), notes + left_out


def load_runs(paths: list[str | Path]) -> RunSet:
    """Read each run directory (UsageError for one that is missing, corrupt or lacks a needed column) and keep the
    points a figure can draw, noting the rest."""
    runs, frames, notes = [], [], []
    for p in paths:
        path = Path(p)
        meta = read_run_json(path)
        frame = load_summary(path)
        missing = [c for c in NEEDED if c not in frame.columns]
        if missing:
            raise UsageError(f"{path}: summary lacks column(s) {', '.join(missing)}")
        frame, why = drawable(frame, path)
        runs.append(Run(path, meta))
        frames.append(frame)
        notes += why
        if share := recorded_sharing(meta.get("cpu_sharing")):
            notes.append(f"{path}: {sharing_text(share)}")
    summary = pd.concat(frames, ignore_index=True).sort_values([*CURVE_KEYS, "size_bytes"], ignore_index=True)
    return RunSet(tuple(runs), summary, tuple(notes))


def curve_label(key: dict, varying: set[str]) -> str:
    """A legend label naming only what differs between the curves of one figure (always the process count)."""
    parts = [f"p={key['procs']}"]
    parts += [str(key[k]) for k in ("backend", "dtype") if k in varying]
    return ", ".join(parts)
