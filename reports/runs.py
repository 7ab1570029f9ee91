"""Sweep runs as the report reads them: provenance and measured points of one or more run directories."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from microbench.errors import UsageError
from microbench.records import load_summary, read_run_json

NEEDED = ("run_id", "backend", "op", "link", "procs", "dtype", "size_bytes",
          "median_s", "ci_low_s", "ci_high_s")
NUMERIC = ("procs", "size_bytes", "median_s", "ci_low_s", "ci_high_s")
CURVE_KEYS = ("backend", "op", "link", "procs", "dtype")
"""One measured curve (latency against size) per distinct value of these columns."""


@dataclass(frozen=True)
class Run:
    path: Path
    meta: dict


@dataclass(frozen=True)
class RunSet:
    """The runs a report covers and their summary rows, concatenated, sorted by curve and size."""

    runs: tuple[Run, ...]
    summary: pd.DataFrame

    def op_links(self) -> list[tuple[str, str]]:
        """(op, link) pairs measured, in first-seen order of the sorted summary."""
        return list(dict.fromkeys(zip(self.summary["op"], self.summary["link"])))

    def curves(self, op: str, link: str) -> list[tuple[dict, pd.DataFrame]]:
        """Each measured curve of one op over one link class: (its key values, its rows by size)."""
        rows = self.summary[(self.summary["op"] == op) & (self.summary["link"] == link)]
        return [(dict(zip(CURVE_KEYS, key)), part.sort_values("size_bytes"))
                for key, part in rows.groupby(list(CURVE_KEYS), sort=True)]


def load_runs(paths: list[str | Path]) -> RunSet:
    """Read each run directory; UsageError for anything missing, corrupt or of the wrong shape."""
    runs, frames = [], []
    for p in paths:
        path = Path(p)
        meta = read_run_json(path)
        frame = load_summary(path)
        missing = [c for c in NEEDED if c not in frame.columns]
        if missing:
            raise UsageError(f"{path}: summary lacks column(s) {', '.join(missing)}")
        for col in NUMERIC:
            if not pd.api.types.is_numeric_dtype(frame[col]):
                raise UsageError(f"{path}: summary column {col} is not numeric")
        if frame.empty:
            raise UsageError(f"{path}: run holds no finished points")
        runs.append(Run(path, meta))
        frames.append(frame)
    summary = pd.concat(frames, ignore_index=True).sort_values([*CURVE_KEYS, "size_bytes"], ignore_index=True)
    return RunSet(tuple(runs), summary)


def curve_label(key: dict, varying: set[str]) -> str:
    """A legend label naming only what differs between the curves of one figure (always the process count)."""
    parts = [f"p={key['procs']}"]
    parts += [str(key[k]) for k in ("backend", "dtype") if k in varying]
    return ", ".join(parts)
