"""The scan's rule for nodes and pairs slower than their peers (docs/methodology.md, "Scan: which nodes are slow").
Pure numpy: judged from each pair's figure (or each node's), robust to the slow ones themselves.

A node's score is the better median of its pairs' figures (for an even count, the better of the two middle values),
so one slow partner never drags a healthy node down. The reference is the median of the node scores; the spread is
1.4826 x their median absolute deviation (a standard deviation where scores are normal), and a node or a pair is
slow when it is worse than the reference by more than max(k x spread, tolerance x reference). While fewer than half
the nodes are slow, the reference and the spread are those of the healthy ones."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

MAD_TO_SIGMA = 1.4826
"""A normal distribution's standard deviation per unit of its median absolute deviation."""


@dataclass(frozen=True)
class Rule:
    """How far worse than the reference a figure may be: k robust standard deviations, and at least `tolerance` of
    the reference (so that a very even machine, whose spread is nearly zero, does not flag its noise)."""

    tolerance: float
    k: float = 3.0

    def threshold(self, reference: float, scores: np.ndarray) -> float:
        spread = MAD_TO_SIGMA * float(np.median(np.abs(scores - reference))) if len(scores) else 0.0
        return max(self.k * spread, self.tolerance * abs(reference))


@dataclass(frozen=True)
class Verdict:
    """One figure (pair bandwidth, pair latency, a node's copy or GEMM rate) judged across the machine."""

    metric: str
    higher_is_better: bool
    reference: float                       # the median node score
    threshold: float                       # how far worse than the reference a figure may be
    scores: dict[str, float]               # node -> its score
    slow_nodes: tuple[str, ...]
    slow_pairs: tuple[tuple[str, str], ...] = ()

    def worse(self, value: float) -> bool:
        """Whether `value` is slower than the reference by more than the threshold (NaN never is)."""
        gap = self.reference - value if self.higher_is_better else value - self.reference
        return bool(gap > self.threshold)


def better_median(values, higher_is_better: bool) -> float:
    """The median of finite values; for an even count, the better of the two middle ones (NaN for none)."""
    x = np.sort(np.asarray([v for v in values if math.isfinite(v)], dtype=float))
    if not len(x):
        return math.nan
    lo, hi = x[(len(x) - 1) // 2], x[len(x) // 2]
    return float(hi if higher_is_better else lo)


def _verdict(metric: str, scores: dict[str, float], higher_is_better: bool, rule: Rule) -> Verdict:
    finite = np.array([s for s in scores.values() if math.isfinite(s)], dtype=float)
    reference = float(np.median(finite)) if len(finite) else math.nan
    v = Verdict(metric, higher_is_better, reference, rule.threshold(reference, finite), scores, ())
    return replace(v, slow_nodes=tuple(node for node, s in scores.items() if v.worse(s)))


def judge_pairs(metric: str, pairs: dict[tuple[str, str], float], higher_is_better: bool, rule: Rule,
                nodes: list[str] | None = None) -> Verdict:
    """Slow nodes (by score) and slow pairs (by their own figure) of a pair figure; NaN figures are left out."""
    nodes = nodes or list(dict.fromkeys(n for pair in pairs for n in pair))
    scores = {n: better_median([v for pair, v in pairs.items() if n in pair], higher_is_better) for n in nodes}
    v = _verdict(metric, scores, higher_is_better, rule)
    return replace(v, slow_pairs=tuple(pair for pair, value in pairs.items() if v.worse(value)))


def judge_nodes(metric: str, values: dict[str, float], higher_is_better: bool, rule: Rule) -> Verdict:
    """Slow nodes of a per-node figure (a node's copy or GEMM rate), each node's value its own score."""
    return _verdict(metric, dict(values), higher_is_better, rule)
