"""Rank 0's persistence of a run directory (format: microbench.records). Each finished point is on
disk, atomically, before the next starts; a resumed run skips what is there and redoes nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from microbench.atomic import atomic_write, atomic_write_json
from microbench.errors import UsageError
from microbench.jsonfile import read_json
from microbench.records import (ADDED_SAMPLE_COLUMNS, SAMPLE_COLUMNS, SUMMARY_COLUMNS, PointKey, PointSummary,
                                read_run_json)

CONSOLIDATED = ("summary.parquet", "summary.csv", "samples.parquet")
BISECT = "bisect.json"
"""The sizes the sweep's bisection added (microbench.sweep.run_points), per pass."""


class RunStore:
    def __init__(self, out: str | Path) -> None:
        self.out = Path(out)
        self.points = self.out / "points"

    def prepare(self, resume: bool) -> dict | None:
        """Check the directory can take this run; returns the earlier run.json when resuming one."""
        if self.out.exists() and not self.out.is_dir():
            raise UsageError(f"--out {self.out} exists and is not a directory")
        has_run = (self.out / "run.json").is_file()
        if has_run and not resume:
            raise UsageError(f"{self.out} already holds a run; pass --resume to finish it or choose another --out")
        try:
            self.points.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--out {self.out}: cannot create the run directory ({exc.strerror or exc})") from None
        return read_run_json(self.out) if has_run else None

    def done_ids(self) -> set[str]:
        return {f.stem for f in self.points.glob("*.json")}

    def visits_done(self) -> dict[str, int]:
        """Each point on disk and the visits (rounds) pooled into it; points written before rounds count as
        finished."""
        return {f.stem: _rounds(read_json(f, "point record", finite=False), f) for f in self.points.glob("*.json")}

    def has_point(self, point_id: str) -> bool:
        return (self.points / f"{point_id}.json").is_file()

    def read_point(self, point_id: str) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
        """A point's samples, the round of each, its wrong-element count and the launch of each sample, to pool a
        resumed visit with (points written before rounds or launches: 0)."""
        record = read_json(self.points / f"{point_id}.json", "point record", finite=False)
        table = pq.read_table(self.points / f"{point_id}.parquet")
        zeros = np.zeros(table.num_rows, dtype=np.int64)
        rounds, launches = (table.column(c).to_numpy() if c in table.column_names else zeros
                            for c in ADDED_SAMPLE_COLUMNS)
        return table.column("time_s").to_numpy(), rounds, int(record["wrong"]), launches

    def write_point(self, summary: PointSummary, samples: np.ndarray, rounds: np.ndarray,
                    launches: np.ndarray | None = None) -> None:
        """Samples first, then the summary record whose presence marks the point measured (its `rounds` says how
        many visits it holds); `launches` None: all in one launch."""
        launches = np.zeros(len(samples), dtype=np.int64) if launches is None else launches
        table = pa.table({"run_id": [summary.run_id] * len(samples), "point_id": [summary.point_id] * len(samples),
                          "iteration": np.arange(len(samples), dtype=np.int64), "time_s": samples,
                          "round": np.asarray(rounds, dtype=np.int64), "launch": np.asarray(launches, dtype=np.int64)})
        atomic_write(self.points / f"{summary.point_id}.parquet", lambda tmp: pq.write_table(table, tmp))
        atomic_write_json(self.points / f"{summary.point_id}.json", summary.to_dict())

    def summaries(self, point_ids: list[str]) -> pd.DataFrame:
        """The summary records of those of `point_ids` on disk (records.SUMMARY_COLUMNS)."""
        rows = [read_json(self.points / f"{pid}.json", "point record", finite=False) for pid in point_ids
                if self.has_point(pid)]
        return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))

    def bisected(self) -> tuple[int, dict[tuple[str, str, int], list[int]]]:
        """(bisection passes made, sizes each added per (op, link, procs)) from bisect.json; (0, {}) for a run that
        has none. A resumed launch plans those sizes again, to measure their remaining rounds."""
        path = self.out / BISECT
        if not path.is_file():
            return 0, {}
        data = read_json(path, "bisection record")
        try:
            extra: dict[tuple[str, str, int], list[int]] = {}
            for row in data["points"]:
                extra.setdefault((str(row["op"]), str(row["link"]), int(row["procs"])), []).append(
                    int(row["requested_bytes"]))
            return int(data["passes"]), extra
        except (KeyError, TypeError, ValueError):
            raise UsageError(f"{path}: not a bisection record (passes, points); remove it to bisect afresh") from None

    def add_bisected(self, keys: list[PointKey], bisect_pass: int) -> None:
        """Record the points a bisection pass added (bisect.json, rewritten atomically)."""
        path = self.out / BISECT
        earlier = read_json(path, "bisection record") if path.is_file() else {"passes": 0, "points": []}
        rows = earlier["points"] + [{"op": k.op, "link": k.link, "procs": k.procs, "requested_bytes": k.requested_bytes,
                                     "pass": bisect_pass} for k in keys]
        atomic_write_json(path, {"passes": max(earlier["passes"], bisect_pass), "points": rows})

    def write_run(self, meta: dict) -> None:
        atomic_write_json(self.out / "run.json", meta)

    def start(self, meta: dict) -> None:
        """run.json of a run about to measure, and no consolidated files until it ends: readers then read points/,
        which a resumed run adds to, where a summary of the earlier sweep would hide what it adds if it is cut
        short."""
        for name in CONSOLIDATED:
            (self.out / name).unlink(missing_ok=True)
        self.write_run(meta)

    def consolidate(self) -> pd.DataFrame:
        """summary.parquet, summary.csv and samples.parquet from every finished point."""
        ids = sorted(self.done_ids())
        summary = self.summaries(ids)
        atomic_write(self.out / "summary.parquet", lambda tmp: summary.to_parquet(tmp, index=False))
        atomic_write(self.out / "summary.csv", lambda tmp: summary.to_csv(tmp, index=False))

        def write_samples(tmp: str) -> None:
            schema = pa.schema([("run_id", pa.string()), ("point_id", pa.string()), ("iteration", pa.int64()),
                                ("time_s", pa.float64()), ("round", pa.int64()), ("launch", pa.int64())])
            with pq.ParquetWriter(tmp, schema) as writer:
                for pid in ids:
                    table = pq.read_table(self.points / f"{pid}.parquet")
                    for col in ADDED_SAMPLE_COLUMNS:     # a point written before them, in a resumed run
                        if col not in table.column_names:
                            table = table.append_column(col, pa.array(np.zeros(len(table), dtype=np.int64)))
                    writer.write_table(table.select(list(SAMPLE_COLUMNS)))

        atomic_write(self.out / "samples.parquet", write_samples)
        return summary


def _rounds(record, path: Path) -> int:
    """The visits a point record says it pools (a record written before rounds: finished); one line if it is not a
    record."""
    if not isinstance(record, dict):
        raise UsageError(f"{path}: not a point record (a JSON object); remove it to measure the point again")
    rounds = record.get("rounds", 1 << 30)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise UsageError(f"{path}: point record's rounds is {rounds!r}, not a visit count; remove the file to measure "
                         f"the point again")
    return rounds

