"""Piecewise alpha-beta regression: t = a(p) alpha + b(p) n beta on each size segment, fitted for relative
error (times span six orders of magnitude), with change points in size found by dynamic programming,
their number given or chosen by BIC. Final parameters come from statsmodels (WLS, or RLM with Huber's norm)."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import statsmodels.api as sm
from statsmodels.tools.sm_exceptions import ConvergenceWarning

from calib.algorithms import Algorithm, piecewise_terms, segment_bounds
from calib.result import Segment

TRIM = 0.25
"""Change-point search cost: squared relative residual, capped at TRIM**2 so one bad point cannot buy a segment."""
COST_FLOOR = 1e-4
"""Relative scatter below which better fits earn no more BIC credit (noise-free data would otherwise split)."""


@dataclass(frozen=True)
class Points:
    """Point medians of one fit: process counts, sizes in bytes, seconds, and the nominal size index that
    groups sizes across process counts (for segments and held-out folds)."""

    procs: np.ndarray
    nbytes: np.ndarray
    seconds: np.ndarray
    size_index: np.ndarray

    @classmethod
    def build(cls, procs, nbytes, seconds, nominal) -> "Points":
        nominal = np.asarray(nominal, dtype=float)
        _, index = np.unique(nominal, return_inverse=True)
        return cls(np.asarray(procs, dtype=float), np.asarray(nbytes, dtype=float),
                   np.asarray(seconds, dtype=float), index)

    def take(self, mask: np.ndarray) -> "Points":
        return Points.build(self.procs[mask], self.nbytes[mask], self.seconds[mask], self.size_index[mask])

    @property
    def n_sizes(self) -> int:
        return int(self.size_index.max()) + 1 if len(self.size_index) else 0


@dataclass(frozen=True)
class LineFit:
    """One segment's fitted alpha and beta (Results half of the Model/Results split)."""

    algorithm: str
    method: str
    min_bytes: float
    max_bytes: float
    params: tuple[float, float]                       # alpha_s, beta_s_per_byte
    se: tuple[float, float]
    ci95: tuple[tuple[float, float], tuple[float, float]]
    cov_alpha_beta: float
    rel_resid_sd: float
    r2: float
    n_points: int
    n_sizes: int
    rel_residuals: tuple[float, ...]

    @property
    def alpha_s(self) -> float:
        return self.params[0]

    @property
    def beta_s_per_byte(self) -> float:
        return self.params[1]

    def segment(self) -> Segment:
        """The calibration's record of this segment."""
        return Segment(self.min_bytes, self.max_bytes, self.params[0], self.se[0], tuple(self.ci95[0]), self.params[1],
                       self.se[1], tuple(self.ci95[1]), self.cov_alpha_beta, self.rel_resid_sd, self.r2, self.n_points,
                       self.n_sizes)


def _design(alg: Algorithm, pts: Points) -> np.ndarray:
    a, b = alg.coefficients(pts.procs)
    return np.column_stack([np.broadcast_to(a, pts.seconds.shape), b * pts.nbytes])


HUBER_T = 1.345
"""Huber's tuning constant (statsmodels' HuberT default): residuals beyond 1.345 scale units are down-weighted."""


RESID_FLOOR = 1e-9
"""A relative residual scale at or below this is no scale at all: rounding, not scatter."""


def fit_line(alg: Algorithm, pts: Points, method: str) -> LineFit:
    """statsmodels fit of t = a alpha + b n beta minimising relative error: WLS with weights 1/t^2, or
    Huber RLM on the same system divided through by t. Columns are scaled for conditioning."""
    X = _design(alg, pts)
    t = pts.seconds
    scale = np.maximum(np.linalg.norm(X / t[:, None], axis=0), 1e-300)
    Xs = X / scale
    if method == "huber":
        with warnings.catch_warnings():       # its only one: a scale of 0, handled below
            warnings.simplefilter("ignore", ConvergenceWarning)
            res = sm.RLM(np.ones_like(t), Xs / t[:, None], M=sm.robust.norms.HuberT(HUBER_T)).fit()
        rel_sd = float(res.scale)
    if method == "huber" and not rel_sd > RESID_FLOOR and len(t) > Xs.shape[1]:
        # the residuals' MAD is 0 (half the points on the line, as when 2 of 3 are): Huber's scale says nothing of
        # the scatter, so the statistics come from least squares, which counts the point off the line
        method = "wls"
    if method != "huber":
        res = sm.WLS(t, Xs, weights=1.0 / t ** 2).fit()
        rel_sd = float(math.sqrt(max(res.scale, 0.0)))
    params = np.asarray(res.params) / scale
    cov = np.asarray(res.cov_params()) / np.outer(scale, scale)
    ci = np.asarray(res.conf_int(0.05)) / scale[:, None]
    pred = X @ params
    w = 1.0 / t ** 2
    mean = np.sum(w * t) / np.sum(w)
    ss_tot = float(np.sum(w * (t - mean) ** 2))
    r2 = 1.0 - float(np.sum(w * (t - pred) ** 2)) / ss_tot if ss_tot > 0 else 1.0
    se = np.sqrt(np.maximum(np.diag(cov), 0.0))
    return LineFit(alg.name, method, float(pts.nbytes.min()), float(pts.nbytes.max()),
                   (float(params[0]), float(params[1])), (float(se[0]), float(se[1])),
                   ((float(ci[0, 0]), float(ci[0, 1])), (float(ci[1, 0]), float(ci[1, 1]))),
                   float(cov[0, 1]), rel_sd, float(r2), len(t), pts.n_sizes, tuple((pred - t) / t))


@dataclass(frozen=True)
class Line:
    """One segment's parameters without their statistics: what a held-out refit needs to predict."""

    min_bytes: float
    max_bytes: float
    alpha_s: float
    beta_s_per_byte: float


def _weighted_line(A: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least squares of A p = 1 (2 columns, weights w) by its 2 x 2 normal equations; lstsq where they are
    singular (one size, or one process count's columns alike)."""
    u, v = A[:, 0], A[:, 1]
    uu, uv, vv, su, sv = np.dot(w * u, u), np.dot(w * u, v), np.dot(w * v, v), np.dot(w, u), np.dot(w, v)
    det = uu * vv - uv * uv
    if det > 1e-12 * uu * vv:
        return np.array([(vv * su - uv * sv) / det, (uu * sv - uv * su) / det])
    root = np.sqrt(w)
    return np.linalg.lstsq(A * root[:, None], root, rcond=None)[0]


def line_params(alg: Algorithm, pts: Points, method: str) -> Line:
    """fit_line's estimate without its statistics (Huber: iteratively reweighted least squares, the scale the
    residuals' MAD, as statsmodels' RLM, to a relative 1e-7 of its parameters). The held-out folds refit hundreds of
    lines per model, where statsmodels' per-fit overhead dominated the fit's time."""
    A = _design(alg, pts) / pts.seconds[:, None]
    norms = np.maximum(np.linalg.norm(A, axis=0), 1e-300)
    A = A / norms
    p = _weighted_line(A, np.ones(len(A)))
    if method == "huber":
        for _ in range(50):
            r = np.abs(1.0 - A @ p)
            half = len(r) // 2                      # the median by partition: np.median's overhead was most of the loop
            part = np.partition(r, [half - 1, half] if len(r) % 2 == 0 else half)
            scale = float(part[half] if len(r) % 2 else (part[half - 1] + part[half]) / 2) / 0.6744897501960817
            if scale <= 0:
                break
            new = _weighted_line(A, np.minimum(1.0, HUBER_T * scale / np.maximum(r, 1e-300)))
            settled = all(abs(a - b) <= 1e-10 + 1e-7 * abs(b) for a, b in zip(new, p))
            p = new
            if settled:
                break
    return Line(float(pts.nbytes.min()), float(pts.nbytes.max()), float(p[0] / norms[0]), float(p[1] / norms[1]))


def _segment_costs(alg: Algorithm, pts: Points, min_sizes: int) -> tuple[np.ndarray, np.ndarray]:
    """(cost, priced) over size indices i..j: cost[i, j] the trimmed squared relative residuals of the least-squares
    line, priced[i, j] whether that line prices every size the segment would cover (from where the one below hands
    over to where the one above takes over; calib.algorithms.segment_bounds) at a time of at least zero, at every
    process count. Every (i, j) at once: 2x2 normal equations from prefix sums, then all residuals in one array."""
    m = pts.n_sizes
    A = _design(alg, pts) / pts.seconds[:, None]
    norms = np.maximum(np.linalg.norm(A, axis=0), 1e-300)
    A = A / norms
    u, v, idx = A[:, 0], A[:, 1], pts.size_index
    per_size = np.zeros((m + 1, 5))
    np.add.at(per_size, idx + 1, np.column_stack([u * u, u * v, v * v, u, v]))
    prefix = np.cumsum(per_size, axis=0)
    i, j = np.triu_indices(m, k=min_sizes - 1)
    uu, uv, vv, su, sv = (prefix[j + 1] - prefix[i]).T
    det = uu * vv - uv * uv
    ok = det > 1e-12 * uu * vv
    det = np.where(ok, det, 1.0)
    c0, c1 = (vv * su - uv * sv) / det, (uu * sv - uv * su) / det
    r = np.minimum((c0[:, None] * u + c1[:, None] * v - 1.0) ** 2, TRIM * TRIM)
    inside = (idx >= i[:, None]) & (idx <= j[:, None])
    cost = np.full((m, m), np.inf)
    cost[i, j] = np.where(ok, np.sum(r * inside, axis=1), np.inf)
    low, high = np.full(m, np.inf), np.zeros(m)
    np.minimum.at(low, idx, pts.nbytes)
    np.maximum.at(high, idx, pts.nbytes)
    gaps = segment_bounds(high, low)
    start, end = np.concatenate([low[:1], gaps]), np.concatenate([gaps, high[-1:]])
    a, b = alg.coefficients(np.unique(pts.procs))
    alpha, beta = c0 / norms[0], c1 / norms[1]
    lowest = np.minimum(np.outer(alpha, a) + np.outer(beta * start[i], b),
                        np.outer(alpha, a) + np.outer(beta * end[j], b)).min(axis=1)
    priced = np.zeros((m, m), dtype=bool)
    priced[i, j] = lowest >= 0
    return cost, priced


def change_points(alg: Algorithm, pts: Points, max_segments: int, min_sizes: int,
                  count: int | None = None) -> list[tuple[int, int]]:
    """Size-index ranges [(first, last), ...] of the lowest-cost segmentation into segments of at least min_sizes
    distinct sizes each, every segment's line pricing the sizes it covers at a time of at least zero (unless no
    segmentation can): with `count`, that many (or as many as fit); without, the number up to max_segments with
    the lowest BIC."""
    m = pts.n_sizes
    most = min(count or max_segments, m // min_sizes)
    if most <= 1:
        return [(0, m - 1)]
    cost, priced = _segment_costs(alg, pts, min_sizes)
    n = len(pts.seconds)
    return (_segmentation(np.where(priced, cost, np.inf), n, most, count)
            or _segmentation(cost, n, most, count) or [(0, m - 1)])


def _segmentation(cost: np.ndarray, n: int, most: int, count: int | None) -> list[tuple[int, int]] | None:
    """The dynamic program over cost[i, j] (segment i..j) with up to `most` segments: BIC's ranges, or with `count`
    the most segments up to it; None where no segmentation has a finite cost."""
    m = len(cost)
    # best[k][j]: lowest cost of covering sizes 0..j with k+1 segments; back[k][j]: where the last one starts
    best, back = [cost[0]], [np.zeros(m, dtype=int)]
    for _ in range(1, most):
        total = best[-1][None, :-1] + cost[1:, :].T        # [j, i - 1]: sizes 0..i-1 covered, then i..j
        arg = np.argmin(total, axis=1)
        best.append(total[np.arange(m), arg])
        back.append(arg + 1)
    finite = [k for k, b in enumerate(best) if math.isfinite(b[m - 1])]
    if not finite:
        return None
    if count is None:
        k = min(finite, key=lambda k: n * math.log(max(best[k][m - 1] / n, COST_FLOOR ** 2))
                + (3 * (k + 1) - 1) * math.log(n))
    else:
        k = max(finite)
    ranges, j = [], m - 1
    while k >= 0:
        i = int(back[k][j]) if k > 0 else 0
        ranges.append((i, j))
        j, k = i - 1, k - 1
    return ranges[::-1]


@dataclass(frozen=True)
class PiecewiseFit:
    """An algorithm model fitted on size segments; predicts any (procs, bytes)."""

    algorithm: Algorithm
    segments: tuple[LineFit, ...] | tuple[Line, ...]

    def predict(self, procs, nbytes) -> np.ndarray:
        col = lambda attr: np.array([getattr(s, attr) for s in self.segments])  # noqa: E731
        bounds = segment_bounds(col("max_bytes"), col("min_bytes"))
        return piecewise_terms(self.algorithm, bounds, col("alpha_s"), col("beta_s_per_byte"), procs, nbytes)[0]


def fit_piecewise(alg: Algorithm, pts: Points, method: str, max_segments: int, min_sizes: int,
                  count: int | None = None, statistics: bool = True) -> PiecewiseFit:
    """The segmented fit; statistics=False: each segment's parameters alone (line_params), for refits that only
    predict."""
    line = fit_line if statistics else line_params
    ranges = change_points(alg, pts, max_segments, min_sizes, count)
    return PiecewiseFit(alg, tuple(line(alg, pts.take((pts.size_index >= i) & (pts.size_index <= j)), method)
                                   for i, j in ranges))
