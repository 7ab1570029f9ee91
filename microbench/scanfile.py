"""The on-disk format of a scan directory, written by `commcal scan` and read by its report and diff. Pure.

A scan directory holds:
  scan.parquet   one row per measurement (SCAN_COLUMNS): kind "pair" (pingpong between node_a and node_b at one
                 size, in schedule round `round`) or "node" (node_a's copy or gemm, node_b empty, round -1)
  scan.json      provenance (schema "commcal.scan", version SCAN_SCHEMA_VERSION): what run.json records for a
                 sweep, plus `nodes` (in rank order) and the options, the flagging tolerances among them;
                 written last, so its presence marks a finished scan

Rates: a pair's `rate` is size_bytes / median_s (pingpong's time is half the round trip), a copy's is the bytes
read and written per second, a GEMM's its FLOP/s."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from microbench.atomic import atomic_write, atomic_write_json
from microbench.errors import UsageError
from microbench.outliers import Rule, Verdict, judge_nodes, judge_pairs
from microbench.records import read_meta, read_parquet
from microbench.stats import StopRule

SCAN_SCHEMA = "commcal.scan"
SCAN_SCHEMA_VERSION = 1
NODE_OPS = ("copy", "gemm")
TOLERANCES = {"bandwidth": 0.10, "latency": 0.50, "node": 0.25}
"""Default flagging tolerances (Rule.tolerance) of the pair bandwidth, the pair latency and the node checks."""


@dataclass(frozen=True)
class ScanConfig:
    """What a scan measures and how long it may try."""

    sizes: tuple[int, ...]       # ping-pong sizes: the smallest gives the latency, the largest the bandwidth
    rule: StopRule
    rounds: int = 1              # passes over the whole schedule, pooled as the sweep pools its visits
    copy_size: int = 16 << 20
    gemm_size: int = 1 << 20


@dataclass(frozen=True)
class ScanRow:
    kind: str            # "pair" or "node"
    node_a: str
    node_b: str          # "" for a node check
    round: int           # schedule round of a pair; -1 for a node check
    op: str              # pingpong, copy or gemm
    size_bytes: int
    samples: int
    median_s: float
    ci_low_s: float
    ci_high_s: float
    target_met: bool
    rate: float          # bytes/s (pair, copy) or FLOP/s (gemm) at the median
    wrong: int

    def to_dict(self) -> dict:
        return asdict(self)


SCAN_COLUMNS = tuple(ScanRow.__dataclass_fields__)


def write_scan(out: Path, meta: dict, rows: list[ScanRow]) -> None:
    """scan.parquet, then scan.json, each atomically."""
    frame = pd.DataFrame([r.to_dict() for r in rows], columns=list(SCAN_COLUMNS))
    atomic_write(out / "scan.parquet", lambda tmp: frame.to_parquet(tmp, index=False))
    atomic_write_json(out / "scan.json", meta)


@dataclass(frozen=True)
class Scan:
    """A finished scan as its readers see it: provenance, rows, and the verdicts of the flagging rule."""

    path: Path
    meta: dict
    rows: pd.DataFrame

    @property
    def nodes(self) -> list[str]:
        return list(self.meta["nodes"])

    @property
    def pairs(self) -> pd.DataFrame:
        return self.rows[self.rows["kind"] == "pair"]

    @property
    def latency_size(self) -> int:
        return int(self.pairs["size_bytes"].min())

    @property
    def bandwidth_size(self) -> int:
        return int(self.pairs["size_bytes"].max())

    def pair_values(self, size: int, column: str) -> dict[tuple[str, str], float]:
        """(node_a, node_b) -> `column` of the pairs measured at `size`."""
        part = self.pairs[self.pairs["size_bytes"] == size]
        return {(a, b): float(v) for a, b, v in zip(part["node_a"], part["node_b"], part[column])}

    def node_values(self, op: str) -> dict[str, float]:
        part = self.rows[(self.rows["kind"] == "node") & (self.rows["op"] == op)]
        return {n: float(v) for n, v in zip(part["node_a"], part["rate"])}

    def tolerance(self, name: str) -> float:
        return float(self.meta.get("options", {}).get(f"{name}_tolerance", TOLERANCES[name]))

    def verdicts(self) -> tuple[Verdict, ...]:
        """Pair bandwidth (at the largest size), pair latency (at the smallest), and each node check."""
        out = [judge_pairs("bandwidth", self.pair_values(self.bandwidth_size, "rate"), True,
                           Rule(self.tolerance("bandwidth")), self.nodes),
               judge_pairs("latency", self.pair_values(self.latency_size, "median_s"), False,
                           Rule(self.tolerance("latency")), self.nodes)]
        out += [judge_nodes(op, self.node_values(op), True, Rule(self.tolerance("node")))
                for op in NODE_OPS if self.node_values(op)]
        return tuple(out)

    def flagged_nodes(self) -> dict[str, list[str]]:
        """Each slow node and the figures it is slow in, in node order."""
        found: dict[str, list[str]] = {}
        for v in self.verdicts():
            for node in v.slow_nodes:
                found.setdefault(node, []).append(v.metric)
        return {n: found[n] for n in self.nodes if n in found}


def read_scan(path: str | Path) -> Scan:
    """A scan directory, checked: UsageError (one line) for a missing, corrupt or malformed one."""
    path = Path(path)
    meta = read_meta(path / "scan.json", SCAN_SCHEMA, SCAN_SCHEMA_VERSION, "a commcal scan directory")
    nodes = meta.get("nodes")
    if not (isinstance(nodes, list) and len(nodes) >= 2 and all(isinstance(n, str) for n in nodes)):
        raise UsageError(f"{path / 'scan.json'}: 'nodes' must list the scanned nodes' names (two or more)")
    if not isinstance(meta.get("options", {}), dict):
        raise UsageError(f"{path / 'scan.json'}: 'options' must be a JSON object")
    for name in TOLERANCES:
        value = meta.get("options", {}).get(f"{name}_tolerance", TOLERANCES[name])
        if not (isinstance(value, (int, float)) and 0 <= value < math.inf):
            raise UsageError(f"{path / 'scan.json'}: options.{name}_tolerance must be a number >= 0")
    rows = read_parquet(path / "scan.parquet")
    missing = [c for c in SCAN_COLUMNS if c not in rows.columns]
    if missing:
        raise UsageError(f"{path / 'scan.parquet'}: lacks column(s) {', '.join(missing)}")
    for col in ("median_s", "rate", "size_bytes"):
        rows[col] = pd.to_numeric(rows[col], errors="coerce").astype(float)
    known = rows["kind"].isin(["pair", "node"]) & rows["node_a"].isin(nodes) & \
        (rows["node_b"].isin(nodes) | (rows["kind"] == "node")) & (rows["size_bytes"] > 0)
    rows = rows[known].copy()
    if not (rows["kind"] == "pair").any():
        raise UsageError(f"{path / 'scan.parquet'}: no pair measurement between the scan's nodes")
    rows["size_bytes"] = rows["size_bytes"].astype(np.int64)
    return Scan(path, meta, rows.reset_index(drop=True))
