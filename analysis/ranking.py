"""How well predicted times rank strategies the way measured times do (lower is better). Pure numpy/scipy.

Per layer: Kendall tau-b and Spearman rho, top-1 hit, top-k overlap, pairwise order accuracy, regret
(measured time of the predicted best over the measured best, minus 1) and mean accuracy 1 - |pred - meas| /
meas (the ParaDL oracle's definition). Ties in prediction count against the model: the predicted best is
the predicted-fastest strategy with the largest measured time. Over layers a metric is the mean of the
layers where it is defined; confidence intervals come from a bootstrap that resamples each layer's
strategies with replacement."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

NAMES = ("kendall_tau", "spearman_rho", "top1", "topk_overlap", "pairwise_accuracy", "regret", "mean_accuracy")


def _pair(pred, meas) -> tuple[np.ndarray, np.ndarray]:
    pred, meas = np.asarray(pred, dtype=float), np.asarray(meas, dtype=float)
    if pred.shape != meas.shape or pred.ndim != 1 or not len(pred):
        raise ValueError("predicted and measured times must be equal-length, non-empty 1-d sequences")
    if not (np.isfinite(pred).all() and np.isfinite(meas).all()) or (meas <= 0).any():
        raise ValueError("times must be finite, measured times positive")
    return pred, meas


def predicted_best(pred, meas) -> int:
    """Index of the predicted-fastest strategy; among predicted ties, the one measured slowest."""
    pred, meas = _pair(pred, meas)
    tied = np.flatnonzero(pred == pred.min())
    return int(tied[np.argmax(meas[tied])])


def _corr(fn, pred, meas) -> float | None:
    if len(pred) < 2 or np.ptp(pred) == 0 or np.ptp(meas) == 0:
        return None
    return float(fn(pred, meas)[0])


def kendall_tau(pred, meas) -> float | None:
    """Kendall tau-b (ties corrected); None with fewer than 2 strategies or a constant side."""
    return _corr(stats.kendalltau, *_pair(pred, meas))


def spearman_rho(pred, meas) -> float | None:
    return _corr(stats.spearmanr, *_pair(pred, meas))


def top1(pred, meas) -> float:
    pred, meas = _pair(pred, meas)
    return float(meas[predicted_best(pred, meas)] == meas.min())


def topk_overlap(pred, meas, k: int = 3) -> float:
    """|predicted k fastest & measured k fastest| / k (k capped at the strategy count; stable order)."""
    pred, meas = _pair(pred, meas)
    k = min(k, len(pred))
    a = set(np.argsort(pred, kind="stable")[:k].tolist())
    return len(a & set(np.argsort(meas, kind="stable")[:k].tolist())) / k


def pairwise_accuracy(pred, meas) -> float | None:
    """Share of strategy pairs with different measured times that the prediction orders the same way
    (a predicted tie counts one half); None when no pair differs."""
    pred, meas = _pair(pred, meas)
    i, j = np.triu_indices(len(pred), 1)
    sm = np.sign(meas[i] - meas[j])
    keep = sm != 0
    if not keep.any():
        return None
    sp = np.sign(pred[i] - pred[j])[keep]
    return float(np.mean(np.where(sp == 0, 0.5, sp == sm[keep])))


def regret(pred, meas) -> float:
    pred, meas = _pair(pred, meas)
    return float(meas[predicted_best(pred, meas)] / meas.min() - 1)


def accuracy(pred, meas) -> np.ndarray:
    """Per strategy 1 - |pred - meas| / meas."""
    pred, meas = _pair(pred, meas)
    return 1 - np.abs(pred - meas) / meas


def layer_metrics(pred, meas, k: int = 3) -> dict[str, float | None]:
    return {"kendall_tau": kendall_tau(pred, meas), "spearman_rho": spearman_rho(pred, meas),
            "top1": top1(pred, meas), "topk_overlap": topk_overlap(pred, meas, k),
            "pairwise_accuracy": pairwise_accuracy(pred, meas), "regret": regret(pred, meas),
            "mean_accuracy": float(accuracy(pred, meas).mean())}


def over_layers(layers: list[tuple], k: int = 3) -> dict[str, float | None]:
    """Each metric's mean over the layers (pred, meas) where it is defined (None where none is)."""
    per = [layer_metrics(p, m, k) for p, m in layers]
    out = {}
    for name in NAMES:
        vals = [d[name] for d in per if d[name] is not None]
        out[name] = float(np.mean(vals)) if vals else None
    return out


@dataclass(frozen=True)
class Scored:
    value: float
    low: float | None
    high: float | None

    def to_json(self) -> dict:
        return {"value": self.value, "ci95": None if self.low is None else [self.low, self.high]}


def score(layers: list[tuple], k: int = 3, resamples: int = 1000, seed: int = 0) -> dict[str, Scored]:
    """Metrics over layers with 95% percentile-bootstrap intervals (widened to contain the point value when
    resampling shifts them); metrics defined nowhere are left out."""
    layers = [_pair(p, m) for p, m in layers]
    point = over_layers(layers, k)
    rng = np.random.default_rng(seed)
    boots: dict[str, list[float]] = {name: [] for name in NAMES}
    for _ in range(resamples):
        sample = []
        for p, m in layers:
            idx = rng.integers(0, len(p), len(p))
            sample.append((p[idx], m[idx]))
        for name, v in over_layers(sample, k).items():
            if v is not None:
                boots[name].append(v)
    out = {}
    for name, v in point.items():
        if v is None:
            continue
        b = boots[name]
        lo, hi = (float(np.percentile(b, 2.5)), float(np.percentile(b, 97.5))) if len(b) >= 2 else (None, None)
        if lo is not None:
            lo, hi = min(lo, v), max(hi, v)
        out[name] = Scored(v, lo, hi)
    return out
