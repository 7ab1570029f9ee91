"""What changed between two scans of a machine: each pair's bandwidth and latency in A and B and their ratio, and
the nodes and pairs slow in B that were not in A (or no longer are)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from microbench.scanfile import Scan
from reports.document import Table
from reports.scan_view import figure_label, show


@dataclass(frozen=True)
class PairChange:
    pair: tuple[str, str]
    metric: str
    a: float
    b: float

    @property
    def ratio(self) -> float:
        return self.b / self.a if self.a > 0 and math.isfinite(self.b) else math.nan


def pair_changes(a: Scan, b: Scan) -> list[PairChange]:
    """Every pair measured in both scans (by node names), bandwidth then latency."""
    out = []
    for metric, column, size_of in (("bandwidth", "rate", lambda s: s.bandwidth_size),
                                    ("latency", "median_s", lambda s: s.latency_size)):
        va, vb = a.pair_values(size_of(a), column), b.pair_values(size_of(b), column)
        vb = vb | {(y, x): v for (x, y), v in vb.items()}
        out += [PairChange(pair, metric, v, vb[pair]) for pair, v in va.items() if pair in vb]
    return out


def slow(scan: Scan) -> tuple[set[str], set[tuple[str, str, str]]]:
    """(slow nodes, slow pairs as (metric, low name, high name))."""
    verdicts = scan.verdicts()
    return ({n for v in verdicts for n in v.slow_nodes},
            {(v.metric, *sorted(p)) for v in verdicts for p in v.slow_pairs})


@dataclass(frozen=True)
class ScanDiff:
    changes: list[PairChange]
    new_nodes: list[str]
    cleared_nodes: list[str]
    new_pairs: list[tuple[str, str, str]]
    cleared_pairs: list[tuple[str, str, str]]
    unmeasured: tuple[tuple[str, str, str], ...] = ()  # B's figures the rule cannot judge (Scan.unmeasured)

    @property
    def worse(self) -> bool:
        """Something newly slow, or something B cannot vouch for."""
        return bool(self.new_nodes or self.new_pairs or self.unmeasured)


def compare(a: Scan, b: Scan) -> ScanDiff:
    nodes_a, pairs_a = slow(a)
    nodes_b, pairs_b = slow(b)
    return ScanDiff(pair_changes(a, b), sorted(nodes_b - nodes_a), sorted(nodes_a - nodes_b),
                    sorted(pairs_b - pairs_a), sorted(pairs_a - pairs_b), b.unmeasured())


def table(d: ScanDiff) -> Table:
    rows = tuple((f"{c.pair[0]}–{c.pair[1]}", c.metric, show(c.metric, c.a), show(c.metric, c.b),
                  "—" if not math.isfinite(c.ratio) else f"{c.ratio:.3f}") for c in d.changes)
    return Table("Pairs in A and B", ("pair", "figure", "A", "B", "B / A"), rows)


def summary(d: ScanDiff) -> list[str]:
    say = lambda items: ", ".join(items) or "none"  # noqa: E731
    pairs = lambda items: say([figure_label(*f, dash="-") for f in items])  # noqa: E731
    lines = [f"newly slow nodes: {say(d.new_nodes)}; no longer slow: {say(d.cleared_nodes)}",
             f"newly slow pairs: {pairs(d.new_pairs)}; no longer slow: {pairs(d.cleared_pairs)}"]
    if d.unmeasured:
        lines.append(f"without a usable figure in B: {pairs(d.unmeasured)}")
    return lines
