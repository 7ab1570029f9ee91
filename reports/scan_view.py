"""The report's scan section: what the flagging rule found, a heatmap of every pair's bandwidth and latency, and
each node's figures as bars, slow ones in red."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from microbench.outliers import Verdict
from microbench.scanfile import Scan
from microbench.sizes import format_size
from reports.document import Note, Section, Table, Text
from reports.plotting import COLORS, GB, US, new_figure, save_figure

UNITS = {"bandwidth": (1 / 1e6, "MB/s"), "latency": (US, "µs"), "copy": (1 / GB, "GB/s"), "gemm": (1 / GB, "GFLOP/s")}
"""Display scale and unit of each verdict's figure."""
LABELLED = 32
"""Heatmaps name every node up to this many; beyond, only the axes' indices."""


def show(metric: str, value: float) -> str:
    scale, unit = UNITS[metric]
    if not math.isfinite(value):
        return "—"
    shown = value * scale
    return f"{shown:.0f} {unit}" if abs(shown) >= 1e4 else f"{shown:.4g} {unit}"


def figure_label(metric: str, a: str, b: str, dash: str = "–") -> str:
    """A judged figure by name: 'node1–node2 (bandwidth)' for a pair, 'node3 (copy)' for a node check."""
    return f"{a}{dash}{b} ({metric})" if b else f"{a} ({metric})"


def verdict_table(verdicts: tuple[Verdict, ...]) -> Table:
    rows = tuple((v.metric, "higher" if v.higher_is_better else "lower", show(v.metric, v.reference),
                  show(v.metric, v.threshold), ", ".join(v.slow_nodes) or "none",
                  ", ".join(f"{a}–{b}" for a, b in v.slow_pairs) or ("none" if v.metric in ("bandwidth", "latency")
                                                                      else "—")) for v in verdicts)
    return Table("The flagging rule's verdicts", ("figure", "better", "reference (median node score)",
                                                 "allowed worse by", "slow nodes", "slow pairs"), rows)


def matrix(scan: Scan, values: dict[tuple[str, str], float]) -> np.ndarray:
    index = {n: i for i, n in enumerate(scan.nodes)}
    m = np.full((len(index), len(index)), np.nan)
    for (a, b), v in values.items():
        m[index[a], index[b]] = m[index[b], index[a]] = v
    return m


def heatmap(scan: Scan, verdicts: dict[str, Verdict]):
    """Pair bandwidth (left) and latency (right) as node x node matrices; slow pairs outlined."""
    n = len(scan.nodes)
    fig, axes = new_figure(11, 5.2, ncols=2)
    panels = (("bandwidth", scan.pair_values(scan.bandwidth_size, "rate"), "viridis", scan.bandwidth_size),
              ("latency", scan.pair_values(scan.latency_size, "median_s"), "viridis_r", scan.latency_size))
    index = {node: i for i, node in enumerate(scan.nodes)}
    for ax, (metric, values, cmap, size) in zip(axes, panels):
        scale, unit = UNITS[metric]
        image = ax.imshow(matrix(scan, values) * scale, cmap=cmap, interpolation="nearest")
        fig.colorbar(image, ax=ax, label=unit, shrink=0.8)
        for a, b in verdicts[metric].slow_pairs:
            for i, j in ((index[a], index[b]), (index[b], index[a])):
                ax.add_patch(_box(i, j))
        ax.grid(False)
        ax.set_title(f"pair {metric} at {format_size(size)}B")
        if n <= LABELLED:
            ax.set_xticks(range(n), scan.nodes, rotation=90, fontsize=7)
            ax.set_yticks(range(n), scan.nodes, fontsize=7)
    return fig


def _box(i: int, j: int):
    from matplotlib.patches import Rectangle

    return Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor=COLORS[3], linewidth=1.5)


def node_bars(scan: Scan, verdicts: tuple[Verdict, ...]):
    """One panel per verdict: each node's score (its better-median pair figure, or its own rate), the reference
    as a line and the limit as a dashed one; slow nodes red."""
    fig, axes = new_figure(4.2 * len(verdicts), 1.6 + 0.18 * len(scan.nodes) if len(scan.nodes) <= LABELLED else 4,
                           ncols=len(verdicts))
    for ax, v in zip(axes, verdicts):
        scale, unit = UNITS[v.metric]
        y = np.arange(len(scan.nodes))[::-1]
        values = np.array([v.scores.get(n, np.nan) for n in scan.nodes]) * scale
        ax.barh(y, values, color=[COLORS[3] if n in v.slow_nodes else COLORS[0] for n in scan.nodes])
        limit = v.reference - v.threshold if v.higher_is_better else v.reference + v.threshold
        ax.axvline(v.reference * scale, color="black", linewidth=0.8)
        ax.axvline(limit * scale, color="black", linewidth=0.8, linestyle="--")
        ax.set_xlabel(unit)
        ax.set_title(v.metric)
        if len(scan.nodes) <= LABELLED:
            ax.set_yticks(y, scan.nodes, fontsize=7)
    return fig


def section(scan: Scan | None, root: Path) -> Section:
    title = "Scan"
    if scan is None:
        return Section("scan", title, (Note("No scan given (--scan DIR)."),))
    verdicts = scan.verdicts()
    flagged = scan.flagged_nodes()
    meta = scan.meta
    blocks = [Text(f"{len(scan.nodes)} nodes scanned {meta.get('start_time', '?')} – {meta.get('end_time', '?')} "
                   f"({scan.path}): every pair's ping-pong at {format_size(scan.latency_size)}B (latency, half the "
                   f"round trip) and {format_size(scan.bandwidth_size)}B (bandwidth), in rounds of disjoint pairs "
                   "measured at once, then every node's copy and GEMM rate. A node's score is the better median of "
                   "its pairs; a node or pair is slow when worse than the median node score by more than 3 robust "
                   "standard deviations or the tolerance, whichever is more (docs/methodology.md, \"Scan\").")]
    if flagged:
        blocks.append(Note("Slow nodes: " + "; ".join(f"{n} ({', '.join(m)})" for n, m in flagged.items()),
                           "warning"))
    else:
        blocks.append(Note("No node is slower than its peers by the rule."))
    loose = [(v.metric, a, b) for v in verdicts for a, b in v.slow_pairs if a not in flagged and b not in flagged]
    if loose:
        blocks.append(Note("Slow pairs between nodes that are not slow themselves (a link or switch port?): "
                           + ", ".join(figure_label(*f) for f in loose), "warning"))
    unmeasured = scan.unmeasured()
    if unmeasured:
        blocks.append(Note("Not judged, no usable figure (missing, or a time or rate that is not a positive number): "
                           + ", ".join(figure_label(*f) for f in unmeasured), "warning"))
    if scan.rechecks:
        blocks.append(Table("Measured twice: what the first measurement flagged, and the faster figure kept",
                            ("op", "node or pair", "size", "first median", "second median", "kept"),
                            tuple((r.op, f"{r.node_a}–{r.node_b}" if r.node_b else r.node_a,
                                   f"{format_size(r.size_bytes)}B", f"{r.first_s * 1e6:.2f} µs",
                                   f"{r.second_s * 1e6:.2f} µs", "second" if r.kept_second else "first")
                                  for r in scan.rechecks)))
    by_metric = {v.metric: v for v in verdicts}
    blocks += [verdict_table(verdicts),
               save_figure(heatmap(scan, by_metric), root, "scan-pairs", "Pair bandwidth and latency",
                           "Every node pair's bandwidth (left) and latency (right); slow pairs outlined in red."),
               save_figure(node_bars(scan, verdicts), root, "scan-nodes", "Node scores",
                           "Each node's score per figure: its better-median pair bandwidth and latency, its copy "
                           "and GEMM rates; solid line the reference, dashed the limit, slow nodes in red.")]
    return Section("scan", title, tuple(blocks))
