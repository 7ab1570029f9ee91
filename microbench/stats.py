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

from microbench.limits import MAX_SAMPLES


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


def _weighted(visits: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Every visit's samples sorted, with their cumulative weight (every visit weighing the same; ends at 1)."""
    x = np.concatenate(visits)
    w = np.concatenate([np.full(len(v), 1.0 / (len(visits) * len(v))) for v in visits])
    order = np.argsort(x, kind="stable")
    x, cum = x[order], np.cumsum(w[order])
    return x, cum / cum[-1]


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
    x, cum = _weighted(visits)
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


SPEED_GAP = 0.15
"""Calls of one point ran at different speeds where its sorted samples jump by more than this share: Open MPI's TCP
rendezvous ran 1-4 MiB exchanges between two nodes at 1x, 1.5x or 2x their wire time, call by call, while calls at
one speed lay within a few percent of each other (docs/results.md, "Speeds within a launch")."""
SPEED_SHARE = 0.25
"""The share of a point's calls (every visit weighing the same) that makes a speed: fewer calls on one side of a gap
are fast or slow outliers, not a speed the machine delivers."""
MINORITY_SHARE = 0.05
"""The share of a point's calls, with MINORITY_CALLS of them at least, that makes a fast minority speed: timing noise
only adds time, so calls clustered below the rest ran at a speed the machine delivers, and the share a sweep draws
says little about a later launch's (the same inter-node points ran 0-93% of their calls at the fast speed from launch
to launch: docs/results.md, "The default path at two rates"). A minority is priced only where it is sustained
(calib.points.sustained_minorities): a token bucket's burst is a fast minority too."""
MINORITY_CALLS = 2


@dataclass(frozen=True)
class Speed:
    """A speed of a point's calls: its median, its share and how much slower the rest ran (point_speeds)."""

    median: float       # the price
    share: float        # the share of the calls at the priced speed or faster (1.0: one speed, the pooled median)
    slow_ratio: float   # the median of the slower calls over the price (1.0: one speed)


def point_speeds(visits: list[np.ndarray]) -> tuple[Speed, Speed]:
    """A point's price and its fast minority speed. Where its sorted samples split at a gap into speeds that each hold
    at least SPEED_SHARE of the calls, the price is the fastest speed's median: the pooled median of such calls lies
    on a slower speed, between two, or (the fast one holding most) above the fast speed's middle by the share of slow
    calls, while a validate's steps, between computations, ran at the fast speed in most launches
    (docs/methodology.md, "Speeds"); elsewhere the pooled median. The minority is the fastest speed held by
    MINORITY_SHARE of the calls and MINORITY_CALLS calls, the slower ones holding SPEED_SHARE (the price itself where
    there is none)."""
    visits = [np.asarray(v, dtype=float) for v in visits if len(v)]
    if not visits:
        return Speed(float("nan"), 1.0, 1.0), Speed(float("nan"), 1.0, 1.0)
    x, cum = _weighted(visits)
    price = _split(x, cum, SPEED_SHARE, 1)
    if price is None:
        # one speed: pooled_estimate's median, from the one sort (estimate()'s for one visit, the weighted one)
        pooled = (_midpoint(float(x[(len(x) - 1) // 2]), float(x[len(x) // 2])) if len(visits) == 1
                  else _weighted_quantile(x, cum, 0.5, between=True))
        price = Speed(pooled, 1.0, 1.0)
    minority = _split(x, cum, MINORITY_SHARE, MINORITY_CALLS)
    return price, (minority if minority is not None and minority.median < price.median else price)


def _split(x: np.ndarray, cum: np.ndarray, share: float, calls: int) -> Speed | None:
    """The first gap of the sorted samples with `share` of the weight (and `calls` samples) below it and SPEED_SHARE
    above: the speed below it, priced at its median; None where there is no such gap."""
    for i in np.flatnonzero(x[1:] > x[:-1] * (1 + SPEED_GAP)):
        if cum[i] >= share and i + 1 >= calls:
            if 1 - cum[i] < SPEED_SHARE - 1e-12 or not x[i] > 0:
                return None
            fast = _weighted_quantile(x[:i + 1], cum[:i + 1] / cum[i], 0.5, between=True)
            rest = (cum[i + 1:] - cum[i]) / (1 - cum[i])
            slow = _weighted_quantile(x[i + 1:], rest, 0.5, between=True)
            return Speed(fast, float(cum[i]), slow / fast)
    return None


@dataclass(frozen=True)
class StopRule:
    """Repeat until the median's 95% CI is within +-target_ci, or until the point's time budget runs
    out; either way only after min_samples, so that one stalled iteration (a TCP retransmission, a
    descheduled rank) can never become a point's median."""

    target_ci: float = 0.02
    min_samples: int = 10
    max_samples: int = MAX_SAMPLES
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
