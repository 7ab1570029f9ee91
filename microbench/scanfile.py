"""The on-disk format of a scan directory, written by `commcal scan` and read by its report and diff. Pure.

A scan directory holds:
  scan.parquet   one row per measurement (SCAN_COLUMNS): kind "pair" (pingpong between node_a and node_b at one
                 size, in schedule round `round`) or "node" (node_a's copy or gemm, node_b empty, round -1)
  scan.json      provenance (schema "commcal.scan", version SCAN_SCHEMA_VERSION): what run.json records for a
                 sweep, plus `nodes` (in rank order), the options (the flagging tolerances among them) and
                 `rechecked` (each figure measured twice: both medians and which was kept; the rows hold it);
                 written last, so its presence marks a finished scan

Rates: a pair's `rate` is size_bytes / median_s (pingpong's time is half the round trip), a copy's is the bytes
read and written per second, a GEMM's its FLOP/s."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd

from microbench.atomic import atomic_write, atomic_write_json
from microbench.errors import UsageError
from microbench.jsonfile import input_path
from microbench.outliers import Rule, Verdict, judge_nodes, judge_pairs
from microbench.records import read_meta, read_parquet
from microbench.limits import MAX_BYTES
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
    recheck: bool = True         # measure each flagged figure once more, keeping the faster of the two


@dataclass(frozen=True)
class Suspects:
    """What the first measurement flags, to be measured once more: pairs (by node names) and nodes."""

    pairs: tuple[tuple[str, str], ...] = ()
    nodes: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.pairs or self.nodes)


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


def _flag(value) -> bool:
    """A JSON boolean, or ValueError (a string "false" must not read as true)."""
    if not isinstance(value, bool):
        raise ValueError(f"not a boolean: {value!r}")
    return value


@dataclass(frozen=True)
class Recheck:
    """One figure measured twice: its two medians and whether the second (the faster) was kept; scan.json holds
    each as a JSON object of these fields."""

    op: str
    node_a: str
    node_b: str
    size_bytes: int
    first_s: float
    second_s: float
    kept_second: bool


def merge_rechecks(rows: list[ScanRow], again: list[ScanRow]) -> tuple[list[ScanRow], list[Recheck]]:
    """Each row measured again keeps the faster of its two measurements (a passing disturbance only ever slows a
    measurement; a lasting fault repeats), with the wrong elements of both; and a record of each second look."""
    key = lambda r: (r.kind, r.node_a, r.node_b, r.op, r.size_bytes)  # noqa: E731
    second = {key(r): r for r in again}
    kept, record = [], []
    for r in rows:
        s = second.get(key(r))
        if s is None:
            kept.append(r)
            continue
        better = s if 0 < s.median_s < r.median_s or not r.median_s > 0 else r
        kept.append(replace(better, wrong=r.wrong + s.wrong))
        record.append(Recheck(r.op, r.node_a, r.node_b, r.size_bytes, r.median_s, s.median_s, better is s))
    return kept, record


def rows_frame(rows: list[ScanRow]) -> pd.DataFrame:
    return pd.DataFrame([r.to_dict() for r in rows], columns=list(SCAN_COLUMNS))


def write_scan(out: Path, meta: dict, rows: list[ScanRow]) -> None:
    """scan.parquet, then scan.json, each atomically."""
    frame = rows_frame(rows)
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

    def unmeasured(self) -> tuple[tuple[str, str, str], ...]:
        """(figure, node_a, node_b) of each pair figure and node check the verdicts cannot judge: missing, or its
        time or rate not a positive number (node_b empty for a node check)."""
        out = []
        for metric, size, column in (("bandwidth", self.bandwidth_size, "rate"),
                                     ("latency", self.latency_size, "median_s")):
            got = self.pair_values(size, column)
            got |= {(b, a): v for (a, b), v in got.items()}
            out += [(metric, a, b) for a, b in combinations(self.nodes, 2) if not math.isfinite(got.get((a, b), math.nan))]
        for op in NODE_OPS:
            values = self.node_values(op)
            if values:
                out += [(op, n, "") for n in self.nodes if not math.isfinite(values.get(n, math.nan))]
        return tuple(out)

    @property
    def rechecks(self) -> tuple[Recheck, ...]:
        """The figures measured twice (scan.json `rechecked`); entries that are not well formed are left out."""
        entries = self.meta.get("rechecked", [])
        out = []
        for e in entries if isinstance(entries, list) else []:
            try:
                out.append(Recheck(str(e["op"]), str(e["node_a"]), str(e["node_b"]), int(e["size_bytes"]),
                                   float(e["first_s"]), float(e["second_s"]), _flag(e["kept_second"])))
            except (KeyError, TypeError, ValueError):
                continue
        return tuple(out)

    def suspects(self) -> Suspects:
        """The slow pairs of either pair figure and the slow nodes of the node checks (pairs sorted, nodes in scan
        order; the recheck measures pairs in their schedule rounds whatever this order)."""
        pairs: set[tuple[str, str]] = set()
        nodes: set[str] = set()
        for v in self.verdicts():
            pairs.update(v.slow_pairs)
            if v.metric in NODE_OPS:
                nodes.update(v.slow_nodes)
        return Suspects(tuple(sorted(pairs)), tuple(n for n in self.nodes if n in nodes))


def read_scan(path: str | Path) -> Scan:
    """A scan directory, checked: UsageError (one line) for a missing, corrupt or malformed one."""
    path = input_path(path)
    meta = read_meta(path / "scan.json", SCAN_SCHEMA, SCAN_SCHEMA_VERSION, "a commcal scan directory")
    nodes = meta.get("nodes")
    if not (isinstance(nodes, list) and len(nodes) >= 2 and all(isinstance(n, str) for n in nodes)
            and len(set(nodes)) == len(nodes)):
        raise UsageError(f"{path / 'scan.json'}: 'nodes' must list the scanned nodes' names (two or more, each once)")
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
        (rows["node_b"].isin(nodes) | (rows["kind"] == "node")) & (rows["size_bytes"] > 0) & (rows["size_bytes"] <= MAX_BYTES)
    rows = rows[known].copy()
    usable = np.isfinite(rows["median_s"]) & (rows["median_s"] > 0) & np.isfinite(rows["rate"]) & (rows["rate"] > 0)
    rows.loc[~usable, ["median_s", "rate"]] = math.nan  # no figure: left out of the verdicts, listed by unmeasured()
    if not (rows["kind"] == "pair").any():
        raise UsageError(f"{path / 'scan.parquet'}: no pair measurement between the scan's nodes")
    rows["size_bytes"] = rows["size_bytes"].astype(np.int64)
    return Scan(path, meta, rows.reset_index(drop=True))
