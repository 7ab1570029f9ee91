"""The report's validation section, and the contract for what `commcal validate` leaves in its directory.

A validation directory DIR holds (either file may be absent; the section then says what is missing):

  DIR/summary.json   {"metrics": {NAME: {"value": number, "ci95": [low, high] or null}, ...}, ...}
      NAME is any of kendall_tau (Kendall's tau between predicted and measured order), top1 (fraction of layers
      whose predicted-best strategy is the measured best), regret (measured time of the predicted-best strategy
      over the measured best, minus 1, averaged over layers), mean_accuracy (mean pairwise ordering accuracy);
      other names are shown too. Other top-level members with scalar values (calibration, machine, date, ...)
      are shown as a table.
  DIR/strategies.parquet or DIR/strategies.csv   one row per (layer, strategy):
      required: layer, strategy, predicted_s, measured_s
      optional: predicted_low_s, predicted_high_s (prediction interval), measured_ci_low_s, measured_ci_high_s,
                predicted_comm_s, measured_comm_s (the communication part of each time)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from microbench.errors import UsageError
from reports.document import Note, Section, Table, Text
from reports.plotting import COLORS, log_values, new_figure, save_figure

REQUIRED = ("layer", "strategy", "predicted_s", "measured_s")
OPTIONAL = ("predicted_low_s", "predicted_high_s", "measured_ci_low_s", "measured_ci_high_s",
            "predicted_comm_s", "measured_comm_s")
METRICS = {"kendall_tau": ("Kendall's tau", (-1, 1)), "top1": ("top-1 accuracy", (0, 1)),
           "regret": ("regret of predicted best", None), "mean_accuracy": ("mean pairwise accuracy", (0, 1))}
"""Known metric names: their titles and natural ranges (None: open-ended, from 0)."""
TIME_LABEL = "time per step (ms)"
MS = 1e3


@dataclass(frozen=True)
class Metric:
    name: str
    value: float
    low: float | None
    high: float | None

    @property
    def title(self) -> str:
        return METRICS.get(self.name, (self.name.replace("_", " "), None))[0]


@dataclass(frozen=True)
class Validation:
    path: Path
    metrics: tuple[Metric, ...] | None      # None: no summary.json
    info: dict
    strategies: pd.DataFrame | None         # None: no strategies file


def _number(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UsageError(f"{where} must be a finite number, not {value!r}")
    return float(value)


def _read_summary(path: Path) -> tuple[tuple[Metric, ...], dict]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: unreadable validation summary ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict):
        raise UsageError(f"{path}: validation summary must be an object with a 'metrics' object")
    metrics = []
    for name, m in data["metrics"].items():
        if not isinstance(m, dict) or "value" not in m:
            raise UsageError(f"{path}: metrics.{name} must be an object with a 'value'")
        value = _number(m["value"], f"{path}: metrics.{name}.value")
        ci = m.get("ci95")
        if ci is None:
            metrics.append(Metric(name, value, None, None))
            continue
        if not isinstance(ci, list) or len(ci) != 2:
            raise UsageError(f"{path}: metrics.{name}.ci95 must be [low, high] or null")
        metrics.append(Metric(name, value, _number(ci[0], f"{path}: metrics.{name}.ci95[0]"),
                              _number(ci[1], f"{path}: metrics.{name}.ci95[1]")))
    info = {k: v for k, v in data.items() if k != "metrics" and not isinstance(v, (dict, list))}
    return tuple(metrics), info


def _read_strategies(path: Path) -> pd.DataFrame:
    try:
        frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    except Exception as exc:  # pyarrow and the CSV parser raise many types for corrupt files
        raise UsageError(f"{path}: corrupt or unreadable strategies table ({type(exc).__name__})") from None
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise UsageError(f"{path}: strategies table lacks column(s) {', '.join(missing)}")
    if frame.empty:
        raise UsageError(f"{path}: strategies table has no rows")
    for col in (*REQUIRED[2:], *(c for c in OPTIONAL if c in frame.columns)):
        if not pd.api.types.is_numeric_dtype(frame[col]) or not np.isfinite(frame[col]).all():
            raise UsageError(f"{path}: strategies column {col} must hold finite numbers")
    return frame.astype({"layer": str, "strategy": str})


def load_validation(path: str | Path) -> Validation:
    """Read DIR per the module contract; UsageError if DIR holds neither file or a file is corrupt."""
    path = Path(path)
    summary = path / "summary.json"
    table = next((path / f"strategies.{ext}" for ext in ("parquet", "csv") if (path / f"strategies.{ext}").is_file()),
                 None)
    if not path.is_dir() or (not summary.is_file() and table is None):
        raise UsageError(f"{path}: not a validation directory (no summary.json or strategies.parquet/.csv)")
    metrics, info = _read_summary(summary) if summary.is_file() else (None, {})
    return Validation(path, metrics, info, _read_strategies(table) if table is not None else None)


def paired_bars_figure(frame: pd.DataFrame):
    """Per layer, predicted and measured time of each strategy side by side, sorted by measured time; the
    communication part hatched where the table has it; whiskers are the intervals where it has them."""
    layers = list(dict.fromkeys(frame["layer"]))
    ncols = min(3, len(layers))
    nrows = math.ceil(len(layers) / ncols)
    width_per = max(4.0, 0.55 * frame.groupby("layer").size().max() + 1.5)
    fig, axes = new_figure(width_per * ncols, 3.6 * nrows + 0.6, ncols=ncols, nrows=nrows)
    for ax, layer in zip(axes, layers):
        rows = frame[frame["layer"] == layer].sort_values("measured_s")
        x = np.arange(len(rows))
        for offset, kind, color, low, high in ((-0.2, "measured", COLORS[0], "measured_ci_low_s", "measured_ci_high_s"),
                                               (0.2, "predicted", COLORS[1], "predicted_low_s", "predicted_high_s")):
            y = rows[f"{kind}_s"].to_numpy() * MS
            err = None
            if low in rows and high in rows:
                err = [y - rows[low].to_numpy() * MS, rows[high].to_numpy() * MS - y]
            ax.bar(x + offset, y, 0.4, yerr=err, capsize=2, color=color, label=kind)
            if f"{kind}_comm_s" in rows:
                ax.bar(x + offset, rows[f"{kind}_comm_s"].to_numpy() * MS, 0.4, fill=False, hatch="///",
                       edgecolor="0.25", linewidth=0, label=f"{kind}: communication")
        ax.set_xticks(x, rows["strategy"], rotation=30, ha="right", fontsize=8)
        ax.set_xlabel("strategy (sorted by measured time)")
        ax.set_ylabel(TIME_LABEL)
        ax.set_title(f"layer {layer}")
    for ax in axes[len(layers):]:
        ax.set_visible(False)
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle("Predicted vs measured time per strategy", fontsize=12)
    return fig


def scatter_figure(frame: pd.DataFrame):
    """Predicted against measured time on log axes, one colour per layer, with the y = x line."""
    fig, (ax,) = new_figure(6.2, 5.6)
    for i, layer in enumerate(dict.fromkeys(frame["layer"])):
        rows = frame[frame["layer"] == layer]
        ax.scatter(rows["measured_s"] * MS, rows["predicted_s"] * MS, s=28, color=COLORS[i % len(COLORS)],
                   label=f"layer {layer}", zorder=3)
    both = np.concatenate([frame["measured_s"], frame["predicted_s"]]) * MS
    lo, hi = both[both > 0].min() / 1.5, both.max() * 1.5
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, linestyle="--", label="y = x")
    log_values(ax.xaxis)
    log_values(ax.yaxis)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    ax.set_xlabel("measured time per step (ms)")
    ax.set_ylabel("predicted time per step (ms)")
    ax.set_title("Predicted vs measured")
    ax.legend(fontsize=8, loc="upper left")
    return fig


def ranking_figure(metrics: tuple[Metric, ...]):
    """One small panel per metric: the value as a dot with its 95% CI, on the metric's natural range."""
    fig, axes = new_figure(3.0 * len(metrics), 2.8, ncols=len(metrics))
    for ax, m in zip(axes, metrics):
        err = None if m.low is None else [[m.value - m.low], [m.high - m.value]]
        ax.errorbar([0], [m.value], yerr=err, marker="o", markersize=8, capsize=6, color=COLORS[0])
        ax.annotate(f"{m.value:.3g}" + ("" if m.low is None else f"\n[{m.low:.3g}, {m.high:.3g}]"),
                    (0, m.value), xytext=(12, 0), textcoords="offset points", va="center", fontsize=9)
        span = METRICS.get(m.name, (None, None))[1]
        top = max(m.value, m.high if m.high is not None else m.value, 0) * 1.2 or 1
        ax.set_ylim(*(span if span else (0, top)))
        ax.set_xlim(-0.5, 1.5)
        ax.set_xticks([])
        ax.set_title(m.title, fontsize=10)
        ax.set_ylabel("value (95% CI)")
    fig.suptitle("Ranking accuracy", fontsize=12)
    return fig


def metrics_table(metrics: tuple[Metric, ...]) -> Table:
    rows = tuple((m.title, f"{m.value:.4g}", "n/a" if m.low is None else f"{m.low:.4g} – {m.high:.4g}")
                 for m in metrics)
    return Table("Ranking accuracy", ("metric", "value", "95% CI"), rows)


def layers_table(frame: pd.DataFrame) -> Table:
    """Per layer: the measured best strategy, the predicted best, and the measured cost of trusting the prediction."""
    rows = []
    for layer, part in frame.groupby("layer", sort=False):
        best = part.loc[part["measured_s"].idxmin()]
        pick = part.loc[part["predicted_s"].idxmin()]
        rows.append((layer, str(len(part)), best["strategy"], f"{best['measured_s'] * MS:.4g}", pick["strategy"],
                     f"{pick['measured_s'] * MS:.4g}", f"{100 * (pick['measured_s'] / best['measured_s'] - 1):.1f}%"))
    return Table("Per layer", ("layer", "strategies", "measured best", "its time (ms)", "predicted best",
                               "its measured time (ms)", "regret"), tuple(rows))


def section(val: Validation | None, root: Path) -> Section:
    title = "Validation"
    if val is None:
        return Section("validation", title, (Note("No validation given (--validation DIR): no predicted-vs-measured "
                                                  "strategy comparison or ranking accuracy."),))
    blocks = [Text(f"Strategies run for real by `commcal validate` ({val.path}), against the calibration's "
                   f"predictions.")]
    if val.info:
        blocks.append(Table("Validation run", ("field", "value"), tuple((k, str(v)) for k, v in val.info.items())))
    if val.metrics:
        blocks += [metrics_table(val.metrics),
                   save_figure(ranking_figure(val.metrics), root, "ranking-accuracy", "Ranking accuracy",
                               "How well the predicted order of strategies matches the measured order, with 95% "
                               "confidence intervals.")]
    else:
        blocks.append(Note(f"{val.path}: no ranking metrics (summary.json is missing or lists none)."))
    if val.strategies is None:
        blocks.append(Note(f"{val.path}: no strategies table (strategies.parquet/.csv): no per-strategy figures."))
        return Section("validation", title, tuple(blocks))
    frame = val.strategies
    blocks += [layers_table(frame),
               save_figure(paired_bars_figure(frame), root, "validation-bars", "Predicted vs measured per strategy",
                           "Measured and predicted time of each strategy, per layer, sorted by measured time; hatched: "
                           "the communication part where recorded; whiskers: intervals where recorded."),
               save_figure(scatter_figure(frame), root, "validation-scatter", "Predicted vs measured scatter",
                           "Each strategy's predicted against measured time; points on the dashed y = x line are "
                           "predicted exactly.")]
    missing = [c for c in OPTIONAL if c not in frame.columns]
    if missing:
        blocks.append(Note(f"The strategies table has no {', '.join(missing)}: those parts are not drawn."))
    return Section("validation", title, tuple(blocks))
