"""How well predicted times rank strategies the way measured times do (lower is better). Pure numpy/scipy.

Per layer: Kendall tau-b and Spearman rho, resolved tau (Kendall's tau over the pairs measured more than
RESOLUTION apart), top-1 hit, top-k overlap, pairwise order accuracy, regret
(measured time of the predicted best over the measured best, minus 1) and mean accuracy 1 - |pred - meas| /
meas (the ParaDL oracle's definition). Ties in prediction count against the model: the predicted best is
the predicted-fastest strategy with the largest measured time. Over layers a metric is the mean of the
layers where it is defined; confidence intervals come from a bootstrap that resamples each layer's
strategies with replacement."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

NAMES = ("kendall_tau", "resolved_tau", "spearman_rho", "top1", "topk_overlap", "pairwise_accuracy", "regret",
         "mean_accuracy")

# The regret target (3%, benchmarks.validate.TARGETS reads it here): pairs of strategies whose measured times lie
# closer than this share of the faster's are left out of resolved_tau, as either is a pick within the target.
RESOLUTION = 0.03


def _pair(pred, meas) -> tuple[np.ndarray, np.ndarray]:
    pred, meas = np.asarray(pred, dtype=float), np.asarray(meas, dtype=float)
    if pred.shape != meas.shape or pred.ndim != 1 or not len(pred):
        raise ValueError("predicted and measured times must be equal-length, non-empty 1-d sequences")
    if not (np.isfinite(pred).all() and np.isfinite(meas).all()) or (meas <= 0).any():
        raise ValueError("times must be finite, measured times positive")
    return pred, meas


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def batch_metrics(pred: np.ndarray, meas: np.ndarray, k: int = 3) -> dict[str, np.ndarray]:
    """Every metric for each row of (B, n) arrays of predicted and measured times; NaN where undefined."""
    n = pred.shape[1]
    i, j = np.triu_indices(n, 1)
    sp, sm = np.sign(pred[:, i] - pred[:, j]), np.sign(meas[:, i] - meas[:, j])
    tau = _ratio((sp * sm).sum(1), np.sqrt((sp != 0).sum(1) * (sm != 0).sum(1)))
    apart = np.abs(meas[:, i] - meas[:, j]) > RESOLUTION * np.minimum(meas[:, i], meas[:, j])
    resolved = _ratio((sp * sm * apart).sum(1), apart.sum(1).astype(float))
    rp = stats.rankdata(pred, axis=1) - (n + 1) / 2
    rm = stats.rankdata(meas, axis=1) - (n + 1) / 2
    rho = _ratio((rp * rm).sum(1), np.sqrt((rp * rp).sum(1) * (rm * rm).sum(1)))
    picked = np.where(pred == pred.min(1, keepdims=True), meas, -np.inf).max(1)
    best = meas.min(1)
    k = min(k, n)
    rows = np.arange(len(pred))[:, None]
    top_p, top_m = np.zeros(pred.shape, bool), np.zeros(pred.shape, bool)
    top_p[rows, np.argsort(pred, 1, kind="stable")[:, :k]] = True
    top_m[rows, np.argsort(meas, 1, kind="stable")[:, :k]] = True
    keep = sm != 0
    agree = np.where(sp == 0, 0.5, (sp == sm).astype(float))
    return {"kendall_tau": tau, "resolved_tau": resolved, "spearman_rho": rho, "top1": (picked == best).astype(float),
            "topk_overlap": (top_p & top_m).sum(1) / k, "pairwise_accuracy": _ratio((agree * keep).sum(1), keep.sum(1)),
            "regret": picked / best - 1, "mean_accuracy": (1 - np.abs(pred - meas) / meas).mean(1)}


def layer_metrics(pred, meas, k: int = 3) -> dict[str, float | None]:
    """One layer's metrics; None where undefined (correlations with fewer than 2 strategies or a constant
    side, pairwise accuracy when no measured pair differs, resolved tau when none lies RESOLUTION apart)."""
    pred, meas = _pair(pred, meas)
    out = batch_metrics(pred[None], meas[None], k)
    return {name: None if np.isnan(v[0]) else float(v[0]) for name, v in out.items()}


def accuracy(pred, meas) -> np.ndarray:
    """Per strategy 1 - |pred - meas| / meas."""
    pred, meas = _pair(pred, meas)
    return 1 - np.abs(pred - meas) / meas


def _over_layers(batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per row, each metric's mean over the layers where it is defined (NaN where none is)."""
    out = {}
    for name in NAMES:
        stack = np.stack([b[name] for b in batches])
        count = (~np.isnan(stack)).sum(0)
        out[name] = _ratio(np.nansum(stack, 0), count.astype(float))
    return out


@dataclass(frozen=True)
class Scored:
    value: float
    low: float | None
    high: float | None

    def to_json(self) -> dict:
        return {"value": self.value, "ci95": None if self.low is None else [self.low, self.high]}


def score(layers: list[tuple], k: int = 3, resamples: int = 1000, seed: int = 0) -> dict[str, Scored]:
    """Metrics over layers (pred, meas) with 95% percentile-bootstrap intervals (widened to contain the point
    value when resampling shifts them); metrics defined nowhere are left out."""
    layers = [_pair(p, m) for p, m in layers]
    point = _over_layers([batch_metrics(p[None], m[None], k) for p, m in layers])
    rng = np.random.default_rng(seed)
    boots = []
    for p, m in layers:
        idx = rng.integers(0, len(p), (resamples, len(p)))
        boots.append(batch_metrics(p[idx], m[idx], k))
    boot = _over_layers(boots) if resamples else {}
    out = {}
    for name in NAMES:
        v = float(point[name][0])
        if np.isnan(v):
            continue
        b = boot.get(name, np.array([]))
        b = b[~np.isnan(b)]
        if len(b) < 2:
            out[name] = Scored(v, None, None)
            continue
        lo, hi = np.percentile(b, [2.5, 97.5])
        out[name] = Scored(v, min(float(lo), v), max(float(hi), v))
    return out


def frame_scores(frame, k: int, resamples: int, seed: int) -> dict:
    """{"total": ..., "comm": ...} metric dicts over a validate strategies table's layers (columns layer,
    predicted_s, measured_s, predicted_comm_s, measured_comm_s, comm_steps); communication only over the
    strategies that communicate."""
    out = {}
    for part, pred, meas in (("total", "predicted_s", "measured_s"), ("comm", "predicted_comm_s", "measured_comm_s")):
        rows = frame if part == "total" else frame[frame["comm_steps"] > 0]
        layers = [(g[pred].to_numpy(), g[meas].to_numpy()) for _, g in rows.groupby("layer", sort=False)]
        out[part] = {n: s.to_json() for n, s in score(layers, k, resamples, seed).items()} if layers else {}
    return out


def text(metric: dict) -> str:
    """A metric as to_json() writes it, as text: the value to 4 significant digits, then its CI to 3."""
    ci = metric["ci95"]
    return f"{metric['value']:.4g}" + ("" if ci is None else f" [{ci[0]:.3g}, {ci[1]:.3g}]")


def flat(scored: dict) -> dict:
    """frame_scores' result as one dict: end-to-end names bare, communication ones prefixed "comm_"."""
    return {**scored["total"], **{f"comm_{n}": v for n, v in scored["comm"].items()}}


def repeat_frame(first, second):
    """A strategies table scoring one validate run's measured times as the prediction of another's, over the
    strategies both ran: the figures no cost model can beat while measurements repeat only this well."""
    keep = ["layer", "strategy", "measured_s", "measured_comm_s", "comm_steps"]
    both = first[keep].merge(second[keep], on=["layer", "strategy", "comm_steps"], suffixes=("_a", ""))
    return both.rename(columns={"measured_s_a": "predicted_s", "measured_comm_s_a": "predicted_comm_s"})
