"""The built-in held-out check: k-fold over sizes (every k-th size left out), the whole piecewise fit redone
on the rest, the left-out sizes predicted; absolute relative errors summarised per model."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from calib.algorithms import Algorithm
from calib.result import HeldOut as HeldOutRecord
from calib.segments import Points, fit_piecewise

SMALL_BYTES = 4096
"""The fidelity targets separate sizes >= 4 KiB (bandwidth-bound, tight target) from all sizes."""


@dataclass(frozen=True)
class HeldOut:
    """Held-out absolute relative errors of one model (None where no point qualified)."""

    folds: int
    n_points: int
    median: float | None
    p90: float | None
    median_ge_4KiB: float | None
    p90_ge_4KiB: float | None

    def result(self) -> HeldOutRecord:
        """The calibration's record of this check."""
        return HeldOutRecord(self.folds, self.n_points, self.median, self.p90, self.median_ge_4KiB, self.p90_ge_4KiB)

    def key(self) -> tuple[float, float]:
        """Sort key for choosing among candidates: lower median, then lower 90th percentile."""
        return (np.inf if self.median is None else self.median, np.inf if self.p90 is None else self.p90)


def _stats(err: np.ndarray) -> tuple[float | None, float | None]:
    if len(err) == 0:
        return None, None
    return float(np.median(err)), float(np.quantile(err, 0.9))


def kfold_over_sizes(alg: Algorithm, pts: Points, method: str, max_segments: int, min_sizes: int,
                     folds: int, count: int | None = None) -> HeldOut:
    """Leave every folds-th size out in turn, refit on the others (change points included; with `count`, that
    many segments), predict it."""
    folds = min(folds, pts.n_sizes)
    if folds < 2 or pts.n_sizes < 4:
        return HeldOut(0, 0, None, None, None, None)
    err = np.full(len(pts.seconds), np.nan)
    for k in range(folds):
        test = pts.size_index % folds == k
        train = pts.take(~test)
        if len(train.seconds) < 3:
            continue
        fit = fit_piecewise(alg, train, method, max_segments, min_sizes, count, statistics=False)
        pred = fit.predict(pts.procs[test], pts.nbytes[test])
        err[test] = np.abs(pred - pts.seconds[test]) / pts.seconds[test]
    ok = np.isfinite(err)
    med, p90 = _stats(err[ok])
    med4, p904 = _stats(err[ok & (pts.nbytes >= SMALL_BYTES)])
    return HeldOut(folds, int(ok.sum()), med, p90, med4, p904)
