"""Order-statistic confidence intervals of the median and the adaptive stopping rule. Pure numpy.

Every Estimate obeys one rule: its CI is either a pair of numbers with min <= ci_low <= median <= ci_high <= max
of its samples, or NaN on both sides where the samples are too few for any interval (fewer than 6 at 95%, or
none); an interval never claims more than the samples show, and a missing one never meets a CI target."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from statistics import NormalDist

import numpy as np


@lru_cache(maxsize=4096)
def median_ci_ranks(n: int, confidence: float = 0.95) -> tuple[int, int] | None:
    """0-based order-statistic indices (lo, hi) bracketing the median with at least `confidence`
    coverage, from the exact Binomial(n, 1/2) distribution; None if n is too small for any interval."""
    if n < 1:
        return None
    alpha = 1.0 - confidence
    # largest j with P(B <= j - 1) <= alpha/2, B ~ Bin(n, 1/2): then [x_(j), x_(n-j+1)] (1-based)
    log_half_n = -n * math.log(2.0)
    cdf, j = 0.0, 0
    for i in range(n + 1):
        p = math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + log_half_n)
        if cdf + p > alpha / 2:
            break
        cdf += p
        j = i + 1
    if j < 1:
        return None
    return j - 1, n - j


@dataclass(frozen=True)
class Estimate:
    """Summary statistics of one point's samples (seconds)."""

    samples: int
    median: float
    ci_low: float
    ci_high: float
    min: float
    p95: float
    mean: float

    def within(self, target: float) -> bool:
        """True when both CI bounds lie within +-target (relative) of the median; never without a CI."""
        if not (math.isfinite(self.ci_low) and math.isfinite(self.ci_high) and self.median > 0):
            return False
        return (self.ci_high - self.median) <= target * self.median and \
               (self.median - self.ci_low) <= target * self.median


def _midpoint(a: float, b: float) -> float:
    """(a + b) / 2 of a <= b, as np.median takes it, but never outside [a, b] (no overflow to infinity)."""
    mid = (a + b) / 2
    if not math.isfinite(mid):
        mid = a / 2 + b / 2
    return min(max(mid, a), b)


def estimate(samples: np.ndarray, confidence: float = 0.95) -> Estimate:
    """The median of finite samples and its order-statistic CI (which contains the median by construction)."""
    x = np.sort(np.asarray(samples, dtype=float))
    n = len(x)
    if n == 0:
        nan = float("nan")
        return Estimate(0, nan, nan, nan, nan, nan, nan)
    ranks = median_ci_ranks(n, confidence)
    lo, hi = (float(x[ranks[0]]), float(x[ranks[1]])) if ranks else (float("nan"), float("nan"))
    median = _midpoint(float(x[(n - 1) // 2]), float(x[n // 2]))
    return Estimate(n, median, lo, hi, float(x[0]), float(np.percentile(x, 95)), float(x.mean()))


def _weighted_quantile(x: np.ndarray, cum: np.ndarray, q: float, between: bool = False) -> float:
    """The first of sorted x whose cumulative weight (cum, ending at 1) reaches q; with `between`, where it lands
    exactly on q, the mean of that value and the next, as np.median does for equal weights."""
    i = min(int(np.searchsorted(cum, q - 1e-12)), len(x) - 1)
    if between and abs(cum[i] - q) <= 1e-12 and i + 1 < len(x):
        return _midpoint(float(x[i]), float(x[i + 1]))
    return float(x[i])


def pooled_estimate(visits: list[np.ndarray], confidence: float = 0.95) -> Estimate:
    """The estimate of several visits' samples with every visit weighing the same (a visit in a disturbed
    window often runs longest and takes most samples; plain pooling would let it set the median). The CI
    is the order-statistic one at Kish's effective sample size, widened to the normal interval of the visits'
    medians taken as one observation each: samples of one window are not independent of each other, and on a
    shared machine the windows' medians differ by more than one window's CI admits; but never beyond the pooled
    samples' range, which is all they show (a visit in a disturbed window would otherwise push the interval below
    zero). One visit: exactly estimate()."""
    visits = [np.asarray(v, dtype=float) for v in visits if len(v)]
    if len(visits) <= 1:
        return estimate(visits[0] if visits else np.empty(0), confidence)
    x = np.concatenate(visits)
    w = np.concatenate([np.full(len(v), 1.0 / (len(visits) * len(v))) for v in visits])
    order = np.argsort(x, kind="stable")
    x, cum = x[order], np.cumsum(w[order])
    cum /= cum[-1]
    n_eff = int(len(visits) ** 2 / sum(1.0 / len(v) for v in visits) + 1e-9)
    ranks = median_ci_ranks(n_eff, confidence)
    lo = hi = float("nan")
    median, p95 = _weighted_quantile(x, cum, 0.5, between=True), _weighted_quantile(x, cum, 0.95)
    if ranks:
        lo, hi = (_weighted_quantile(x, cum, (r + 1) / n_eff) for r in ranks)
        medians = [float(np.median(v)) for v in visits]
        half = NormalDist().inv_cdf(0.5 + confidence / 2) * float(np.std(medians, ddof=1)) / math.sqrt(len(visits))
        lo = max(float(x[0]), min(lo, median - half, median))
        hi = min(float(x[-1]), max(hi, median + half, median))
    return Estimate(len(x), median, lo, hi, float(x[0]), p95,
                    float(np.mean([v.mean() for v in visits])))


MODE_GAP = 0.15
"""Two launches of a point met different modes, not one speed drawn twice, when the slower one's median exceeds the
faster one's by more than this share and their CIs (or, with too few samples for one, their samples) do not
overlap: Open MPI's TCP rendezvous ran a point at 1x or
1.2-2x its wire time, drawn per launch (docs/results.md, "Two speeds per point"), while launches that met one speed
agreed within a few percent."""


@dataclass(frozen=True)
class Modes:
    """A point's launches grouped by the speed they met (a launch whose median lies within MODE_GAP of the next
    faster one's, or whose CI overlaps that one's, met the same speed; a launch of too few samples for a CI stands
    for the range of its samples)."""

    median: float       # the price: the pooled median of the mode most launches met (the faster one on a tie)
    count: int          # speeds seen: 1 where every launch met one (or there was one launch)
    slow_ratio: float   # the slowest mode's median over the priced one (1.0: one speed)


def launch_modes(launches: list[list[np.ndarray]], confidence: float = 0.95) -> Modes:
    """The modes of a point's launches (each a list of its visits' samples). With one speed the price is the
    pooled median of every visit, as pooled_estimate has it; with several, that of the mode most launches met,
    since a pooled median of two speeds lies at whichever holds the middle sample, a speed no launch ran at or the
    rarer one; on a tie the faster, as a disturbance only ever slows a launch."""
    launches = [[v for v in visits if len(v)] for visits in launches]
    launches = [visits for visits in launches if visits]
    if not launches:
        return Modes(float("nan"), 0, 1.0)
    ests = [pooled_estimate(visits, confidence) for visits in launches]
    # a launch's interval: its median's CI, or where it has too few samples for one, the range of its samples
    spans = [(e.ci_low, e.ci_high) if math.isfinite(e.ci_low) else (e.min, max(float(v.max()) for v in visits))
             for e, visits in zip(ests, launches)]
    order = sorted(range(len(ests)), key=lambda i: ests[i].median)
    groups = [[order[0]]]
    for faster, i in zip(order, order[1:]):
        if ests[i].median > ests[faster].median * (1 + MODE_GAP) and spans[i][0] > spans[faster][1]:
            groups.append([i])
        else:
            groups[-1].append(i)
    if len(groups) == 1:
        return Modes(pooled_estimate([v for visits in launches for v in visits], confidence).median, 1, 1.0)
    kept = max(groups, key=len)
    median = pooled_estimate([v for i in kept for v in launches[i]], confidence).median
    slowest = pooled_estimate([v for i in groups[-1] for v in launches[i]], confidence).median
    return Modes(median, len(groups), slowest / median if median > 0 else 1.0)


@dataclass(frozen=True)
class StopRule:
    """Repeat until the median's 95% CI is within +-target_ci, or until the point's time budget runs
    out; either way only after min_samples, so that one stalled iteration (a TCP retransmission, a
    descheduled rank) can never become a point's median."""

    target_ci: float = 0.02
    min_samples: int = 10
    max_samples: int = 1_000_000
    budget_s: float = 1.0

    def done(self, est: Estimate, elapsed_s: float) -> bool:
        if est.samples >= self.max_samples:
            return True
        if est.samples >= self.min_samples and est.within(self.target_ci):
            return True
        return elapsed_s >= self.budget_s and est.samples >= self.min_samples

    def met(self, est: Estimate) -> bool:
        """The target: enough samples and the median's CI within +-target_ci."""
        return est.samples >= self.min_samples and est.within(self.target_ci)

    def visit(self, rounds: int) -> StopRule:
        """The rule of one of `rounds` visits: its share of the budget and of the minimum sample count."""
        return replace(self, budget_s=self.budget_s / rounds, min_samples=max(2, math.ceil(self.min_samples / rounds)))

    def next_batch(self, have: int, per_iter_s: float, elapsed_s: float) -> int:
        """How many iterations to run next: reach min_samples first, then grow geometrically,
        never planning past the remaining budget (but always at least one)."""
        if have < self.min_samples:
            want = self.min_samples - have
        else:
            want = max(have // 2, 8)
        if per_iter_s > 0:
            remaining = max(self.budget_s - elapsed_s, 0.0)
            want = min(want, max(1, int(remaining / per_iter_s + 1e-6)))
        return max(1, min(want, self.max_samples - have, 100_000))


def sample_until_done(batch: Callable[[int], tuple[np.ndarray, float]], rule: StopRule, per_iter: float,
                      total: Callable[[np.ndarray], np.ndarray] = lambda rows: rows) -> np.ndarray:
    """Batches of timed iterations, after warm-up, until `rule` says done: `batch(iters)` returns (rows of
    seconds, wall seconds of the batch), identical on every rank in step; `total` maps the rows to the
    per-iteration seconds the rule judges; `per_iter` is warm-up's seconds per iteration. Returns all rows."""
    chunks, have, elapsed = [], 0, 0.0
    while True:
        iters = rule.next_batch(have, per_iter, elapsed)
        rows, wall = batch(iters)
        chunks.append(rows)
        have, elapsed, per_iter = have + iters, elapsed + wall, wall / iters
        if rule.done(estimate(total(np.concatenate(chunks))), elapsed):
            return np.concatenate(chunks)


def round_spread(visits: list[np.ndarray], median: float) -> float:
    """Half the range of the visits' medians, relative to their pooled median (pooled_estimate's): the drift
    between time windows that the CI of the pooled samples cannot see (0 for one visit)."""
    medians = [float(np.median(v)) for v in visits]
    return (max(medians) - min(medians)) / 2 / median if median > 0 else float("inf")
