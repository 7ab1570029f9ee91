"""The report's validation section, and the contract for what `commcal validate` leaves in its directory.

A validation directory DIR holds (summary.json or the strategies table may be absent; the section says so):

  DIR/summary.json   {"metrics": {NAME: {"value": number or null, "ci95": [low, high] or null}, ...},
                      "layers": {LAYER: {NAME: {...}, ...}, ...} (optional), "notes": [str, ...] (optional), ...}
      NAME is kendall_tau (Kendall's tau between predicted and measured order), top1 (fraction of layers whose
      predicted-best strategy is the measured best), regret (measured time of the predicted-best strategy over
      the measured best, minus 1), mean_accuracy (mean of 1 - |predicted - measured| / measured), or any other
      metric; a "comm_" prefix scores communication time only. Other top-level members with scalar values
      (calibration, mesh, machine, date, ...) are shown as a table. Optional, where the error comes from:
      "by_link": {LINK: {"strategies": n, "comm_mean_accuracy": {"value", "ci95"}}, ...} (communication accuracy
      over the strategies whose collectives spent most of their time on LINK), and "step_ratios": [{"op", "link",
      "steps": n, "median": r, "quartiles": [q1, q3]}, ...] (measured / predicted time of each collective's steps).
  DIR/strategies.parquet or DIR/strategies.csv   one row per (layer, strategy):
      required: layer, strategy, predicted_s, measured_s
      optional: predicted_low_s, predicted_high_s (prediction interval), measured_ci_low_s, measured_ci_high_s,
                predicted_comm_s, measured_comm_s (the communication part of each time); empty (NaN) where unknown;
                refined (true where validate timed the strategy again as a near-best contender)
  DIR/run.json (optional)   provenance of the validation run, shown as a table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from microbench.errors import UsageError
from microbench.jsonfile import input_path, read_json
from microbench.limits import MAX_SECONDS
from microbench.provenance import recorded_sharing, sharing_text
from microbench.stats import SPEED_GAP
from reports import provenance
from reports.document import Note, Section, Table, Text
from reports.plotting import COLORS, log_values, new_figure, save_figure

REQUIRED = ("layer", "strategy", "predicted_s", "measured_s")
OPTIONAL = ("predicted_low_s", "predicted_high_s", "measured_ci_low_s", "measured_ci_high_s",
            "predicted_comm_s", "measured_comm_s")
METRICS = {"kendall_tau": ("Kendall's tau", (-1, 1)), "top1": ("top-1 accuracy", (0, 1)),
           "regret": ("regret of predicted best", None), "mean_accuracy": ("mean accuracy", (0, 1))}
"""The headline metrics drawn in the ranking panel: their titles and natural ranges (None: open-ended, from 0)."""
SCOPES = (("", "end to end"), ("comm_", "communication only"))
MAX_VALUE = 1e300
"""The largest magnitude a summary's metric or step ratio may have: beyond it a figure's axis around it overflows a
double (no score or ratio of real times comes near)."""
TIME_LABEL = "time per step (ms)"
MS = 1e3


@dataclass(frozen=True)
class Metric:
    """One ranking metric; value None where it is undefined (e.g. tau over a single strategy)."""

    name: str
    value: float | None
    low: float | None
    high: float | None

    @property
    def base(self) -> str:
        return self.name.removeprefix("comm_")

    @property
    def scope(self) -> str:
        return dict(SCOPES)["comm_" if self.name.startswith("comm_") else ""]

    @property
    def title(self) -> str:
        return METRICS.get(self.base, (self.base.replace("_", " "), None))[0]


@dataclass(frozen=True)
class LinkAccuracy:
    """Communication mean accuracy over the strategies whose communication went mostly over one link class."""

    link: str
    strategies: int
    accuracy: Metric


@dataclass(frozen=True)
class StepRatio:
    """Measured over predicted time of one collective's steps on one link class: median and quartiles."""

    op: str
    link: str
    steps: int
    median: float
    q1: float
    q3: float
    slow_steps: int | None = None   # steps over 1 + SPEED_GAP where the calibration priced the fast one of several
    verdict: str | None = None      # analysis.attribution.VERDICTS' key (summaries since 2026-11-28)

    @property
    def label(self) -> str:
        return f"{self.op}/{self.link}"

    @property
    def bar(self) -> bool:
        """Whether the quartiles hold the median, so that the figure can draw them as a bar around it."""
        return self.q1 <= self.median <= self.q3


@dataclass(frozen=True)
class Validation:
    path: Path
    metrics: tuple[Metric, ...] | None      # None: no summary.json
    layers: dict[str, tuple[Metric, ...]]   # per-layer metrics, where the summary gives them
    info: dict
    notes: tuple[str, ...]
    by_link: tuple[LinkAccuracy, ...]
    step_ratios: tuple[StepRatio, ...]
    meta: dict | None                       # run.json, where present
    strategies: pd.DataFrame | None         # None: no strategies file


def _number(value, where: str, nullable: bool = False) -> float | None:
    """A JSON number of at most MAX_VALUE in magnitude; null (and NaN) only where `nullable`, read as None."""
    if nullable and (value is None or (isinstance(value, float) and math.isnan(value))):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not abs(value) <= MAX_VALUE:
        raise UsageError(f"{where} must be a finite number (of magnitude {MAX_VALUE:g} at most), not {value!r}")
    return float(value)


def _metric(name: str, m, where: str) -> Metric:
    if not isinstance(m, dict) or "value" not in m:
        raise UsageError(f"{where} must be an object with a 'value'")
    value = _number(m["value"], f"{where}.value", nullable=True)
    ci = m.get("ci95")
    if ci is not None and (not isinstance(ci, list) or len(ci) != 2):
        raise UsageError(f"{where}.ci95 must be [low, high] or null")
    low, high = (None, None) if ci is None else (_number(ci[0], f"{where}.ci95[0]"), _number(ci[1], f"{where}.ci95[1]"))
    return Metric(name, value, low, high)


def _metrics(obj, where: str) -> tuple[Metric, ...]:
    if not isinstance(obj, dict):
        raise UsageError(f"{where} must be an object of metrics")
    return tuple(_metric(name, m, f"{where}.{name}") for name, m in obj.items())


def _count(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UsageError(f"{where} must be a count (an integer >= 0), not {value!r}")
    return value


def _by_link(obj, where: str) -> tuple[LinkAccuracy, ...]:
    if not isinstance(obj, dict):
        raise UsageError(f"{where} must be an object of link classes")
    out = []
    for link, v in obj.items():
        if not isinstance(v, dict) or "comm_mean_accuracy" not in v:
            raise UsageError(f"{where}.{link} must be an object with 'strategies' and 'comm_mean_accuracy'")
        out.append(LinkAccuracy(str(link), _count(v.get("strategies"), f"{where}.{link}.strategies"),
                                _metric("comm_mean_accuracy", v["comm_mean_accuracy"],
                                        f"{where}.{link}.comm_mean_accuracy")))
    return tuple(out)


def _step_ratios(obj, where: str) -> tuple[StepRatio, ...]:
    if not isinstance(obj, list):
        raise UsageError(f"{where} must be a list")
    out = []
    for i, r in enumerate(obj):
        at = f"{where}[{i}]"
        if not isinstance(r, dict) or not all(k in r for k in ("op", "link", "steps", "median", "quartiles")):
            raise UsageError(f"{at} must be an object with op, link, steps, median and quartiles")
        q = r["quartiles"]
        if not isinstance(q, list) or len(q) != 2:
            raise UsageError(f"{at}.quartiles must be [q1, q3]")
        slow, verdict = r.get("slow_steps"), r.get("verdict")
        if verdict is not None and not isinstance(verdict, str):
            raise UsageError(f"{at}.verdict must be a string, not {verdict!r}")
        out.append(StepRatio(str(r["op"]), str(r["link"]), _count(r["steps"], f"{at}.steps"),
                             _number(r["median"], f"{at}.median"), _number(q[0], f"{at}.quartiles[0]"),
                             _number(q[1], f"{at}.quartiles[1]"),
                             None if slow is None else _count(slow, f"{at}.slow_steps"), verdict))
    return tuple(out)


def _read_json(path: Path, what: str) -> dict:
    data = read_json(path, what, finite=False)
    if not isinstance(data, dict):
        raise UsageError(f"{path}: {what} must be a JSON object")
    return data


def _read_summary(path: Path) -> dict:
    """Validation's summary members, each checked: metrics, layers, info, notes, by_link, step_ratios."""
    data = _read_json(path, "validation summary")
    if "metrics" not in data:
        raise UsageError(f"{path}: validation summary has no 'metrics'")
    metrics = _metrics(data["metrics"], f"{path}: metrics")
    layers = data.get("layers", {})
    if not isinstance(layers, dict):
        raise UsageError(f"{path}: 'layers' must be an object of per-layer metrics")
    per_layer = {str(k): _metrics(v, f"{path}: layers.{k}") for k, v in layers.items()}
    notes = data.get("notes", [])
    if not isinstance(notes, list):
        raise UsageError(f"{path}: 'notes' must be a list of strings")
    info = {k: v for k, v in data.items() if not isinstance(v, (dict, list))}
    if share := recorded_sharing(data.get("cpu_sharing")):
        notes = [*notes, sharing_text(share)]
    return {"metrics": metrics, "layers": per_layer, "info": info, "notes": tuple(map(str, notes)),
            "by_link": _by_link(data.get("by_link", {}), f"{path}: by_link"),
            "step_ratios": _step_ratios(data.get("step_ratios", []), f"{path}: step_ratios")}


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
    for col in REQUIRED[:2]:
        if frame[col].isna().any():
            raise UsageError(f"{path}: strategies column {col} must name every row's {col}")
    for col in (*REQUIRED[2:], *(c for c in OPTIONAL if c in frame.columns)):
        values = frame[col]
        bad = not pd.api.types.is_numeric_dtype(values) or np.isinf(values).any()
        if bad or (col in REQUIRED and values.isna().any()):
            raise UsageError(f"{path}: strategies column {col} must hold finite numbers"
                             + ("" if col in REQUIRED else " (or be empty where unknown)"))
        if col.endswith("_s") and not values.dropna().between(0, MAX_SECONDS).all():
            raise UsageError(f"{path}: strategies column {col} must hold times of 0 to {MAX_SECONDS:g} s")
    if "refined" in frame.columns and not pd.api.types.is_bool_dtype(frame["refined"]):
        raise UsageError(f"{path}: strategies column refined must hold true or false in every row")
    return frame.astype({"layer": str, "strategy": str})


def load_validation(path: str | Path) -> Validation:
    """Read DIR per the module contract; UsageError if DIR holds neither file or a file is corrupt."""
    path = input_path(path)
    summary = path / "summary.json"
    table = next((path / f"strategies.{ext}" for ext in ("parquet", "csv") if (path / f"strategies.{ext}").is_file()),
                 None)
    if not path.is_dir() or (not summary.is_file() and table is None):
        raise UsageError(f"{path}: not a validation directory (no summary.json or strategies.parquet/.csv)")
    got = _read_summary(summary) if summary.is_file() else {"metrics": None, "layers": {}, "info": {}, "notes": (),
                                                             "by_link": (), "step_ratios": ()}
    meta = _read_json(path / "run.json", "validation run.json") if (path / "run.json").is_file() else None
    return Validation(path, meta=meta, strategies=_read_strategies(table) if table is not None else None, **got)


def paired_bars_figure(frame: pd.DataFrame):
    """Per layer, predicted and measured time of each strategy side by side, sorted by measured time; the
    communication part hatched where the table has it; whiskers are the intervals where it has them."""
    layers = list(dict.fromkeys(frame["layer"]))
    most = int(frame.groupby("layer").size().max())
    ncols = 1 if most > 10 else min(3, len(layers))   # many strategies: one layer per row, as wide as it takes
    nrows = math.ceil(len(layers) / ncols)
    width_per = min(18.0, max(4.0, 0.5 * most + 1.5))
    fig, axes = new_figure(width_per * ncols, 3.6 * nrows + 0.6, ncols=ncols, nrows=nrows)
    for ax, layer in zip(axes, layers):
        rows = frame[frame["layer"] == layer].sort_values("measured_s")
        x = np.arange(len(rows))
        for offset, kind, color, low, high in ((-0.2, "measured", COLORS[0], "measured_ci_low_s", "measured_ci_high_s"),
                                               (0.2, "predicted", COLORS[1], "predicted_low_s", "predicted_high_s")):
            y = rows[f"{kind}_s"].to_numpy() * MS
            err = None
            if low in rows and high in rows:   # a side that does not hold the bar's value draws no whisker
                err = [np.where(e >= 0, e, np.nan) for e in (y - rows[low].to_numpy() * MS,
                                                              rows[high].to_numpy() * MS - y)]
            ax.bar(x + offset, y, 0.4, yerr=err, capsize=2, color=color, label=kind)
            if f"{kind}_comm_s" in rows:
                ax.bar(x + offset, rows[f"{kind}_comm_s"].to_numpy() * MS, 0.4, fill=False, hatch="///",
                       edgecolor="0.25", linewidth=0, label=f"{kind}: communication")
        ax.set_xticks(x, rows["strategy"], rotation=30 if most <= 10 else 90, ha="right" if most <= 10 else "center",
                      fontsize=8)
        ax.set_xlabel("strategy (sorted by measured time)")
        ax.set_ylabel(TIME_LABEL)
        both = rows[["measured_s", "predicted_s"]].to_numpy().ravel()
        if both.min() > 0 and both.max() / both.min() > 30:   # bars a hundredth of their neighbours vanish
            log_values(ax.yaxis)
            ax.set_ylabel(f"{TIME_LABEL}, log scale")
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
    lo, hi = (both[both > 0].min() / 1.5, both.max() * 1.5) if (both > 0).any() else (1e-3, 1.0)
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


def headline(metrics: tuple[Metric, ...]) -> list[list[Metric | None]]:
    """A grid of the headline metrics with a value: one row per scope that has any, one column per metric name
    that any scope has (None where that scope lacks it)."""
    have = {m.name: m for m in metrics if m.base in METRICS and m.value is not None}
    names = [n for n in METRICS if any(p + n in have for p, _ in SCOPES)]
    rows = [[have.get(p + n) for n in names] for p, _ in SCOPES]
    return [row for row in rows if any(row)]


def ranking_figure(metrics: tuple[Metric, ...]):
    """One small panel per headline metric and scope: the value as a dot with its 95% CI, on the metric's range."""
    grid = headline(metrics)
    ncols = len(grid[0])
    fig, axes = new_figure(2.9 * ncols, 2.6 * len(grid) + 0.4, ncols=ncols, nrows=len(grid))
    for ax, m in zip(axes, (m for row in grid for m in row)):
        if m is None:
            ax.set_visible(False)
            continue
        err = [[m.value - m.low], [m.high - m.value]] if m.low is not None and m.low <= m.value <= m.high else None
        ax.errorbar([0], [m.value], yerr=err, marker="o", markersize=8, capsize=6,
                    color=COLORS[m.name.startswith("comm_")])
        ax.annotate(f"{m.value:.3g}" + ("" if m.low is None else f"\n[{m.low:.3g}, {m.high:.3g}]"),
                    (0, m.value), xytext=(12, 0), textcoords="offset points", va="center", fontsize=9)
        lo, hi = METRICS[m.base][1] or (0, max(m.value, m.high if m.high is not None else m.value, 0) * 1.2 or 1)
        pad = 0.06 * (hi - lo)
        ax.set_ylim(lo - pad, hi + pad)
        ax.set_xlim(-0.5, 1.5)
        ax.set_xticks([])
        ax.set_title(f"{m.title}\n({m.scope})", fontsize=9)
        ax.set_ylabel("value (95% CI)")
    fig.suptitle("Ranking accuracy", fontsize=12)
    return fig


def _value(m: Metric) -> str:
    return "n/a" if m.value is None else f"{m.value:.4g}"


def _interval(m: Metric) -> str:
    return "n/a" if m.low is None else f"{m.low:.4g} – {m.high:.4g}"


def metrics_table(metrics: tuple[Metric, ...]) -> Table:
    rows = tuple((m.scope, m.title, _value(m), _interval(m))
                 for m in sorted(metrics, key=lambda m: m.name.startswith("comm_")))
    return Table("Ranking accuracy over all layers", ("scope", "metric", "value", "95% CI"), rows)


def per_layer_metrics_table(layers: dict[str, tuple[Metric, ...]]) -> Table:
    """Per layer, the headline metrics end to end (value and CI)."""
    rows = []
    for layer, ms in layers.items():
        by = {m.name: m for m in ms}
        rows.append((layer, *(("—" if n not in by else _value(by[n]) + (
            "" if by[n].low is None else f" [{by[n].low:.3g}, {by[n].high:.3g}]")) for n in METRICS)))
    return Table("Ranking accuracy per layer (end to end)", ("layer", *(t for t, _ in METRICS.values())),
                 tuple(rows))


def link_table(by_link: tuple[LinkAccuracy, ...]) -> Table:
    rows = tuple((a.link, str(a.strategies), _value(a.accuracy), _interval(a.accuracy)) for a in by_link)
    return Table("Communication accuracy by the link class carrying most of a strategy's communication",
                 ("link class", "strategies", "comm mean accuracy", "95% CI"), rows)


def step_ratio_table(ratios: tuple[StepRatio, ...]) -> Table:
    """The step ratios; with a column of the steps that ran at a slow speed where any collective was priced at the
    fast one of several (docs/methodology.md#speeds), and one of verdicts where the summary gives them."""
    speeds = any(r.slow_steps is not None for r in ratios)
    verdicts = any(r.verdict is not None for r in ratios)
    rows = tuple((r.op, r.link, str(r.steps), f"{r.median:.3f}", f"{r.q1:.3f} – {r.q3:.3f}")
                 + ((("-" if r.slow_steps is None else str(r.slow_steps)),) if speeds else ())
                 + (((r.verdict or "-").replace("_", " "),) if verdicts else ()) for r in ratios)
    return Table("Collective steps: measured / predicted time", ("collective", "link class", "steps", "median",
                                                                 "quartiles")
                 + ((f"slow-speed steps (over {1 + SPEED_GAP:.2f}x; priced at the fast one of several speeds)",)
                    if speeds else ())
                 + (("verdict (priced; slow speed: one the calibration records; slower; faster)",) if verdicts else ()),
                 rows)


def step_ratio_figure(ratios: tuple[StepRatio, ...]):
    """Each collective and link class: the median measured / predicted step time as a dot, its quartiles as a
    bar, against the line of exact prediction (1)."""
    fig, (ax,) = new_figure(max(5.0, 0.7 * len(ratios) + 2.0), 4.2)
    links = list(dict.fromkeys(r.link for r in ratios))
    for i, r in enumerate(ratios):
        ax.errorbar([i], [r.median], yerr=[[r.median - r.q1], [r.q3 - r.median]] if r.bar else None, marker="o",
                    capsize=4, color=COLORS[links.index(r.link) % len(COLORS)])
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
    ax.set_xticks(range(len(ratios)), [r.label for r in ratios], rotation=30, ha="right", fontsize=8)
    ax.set_xlim(-0.6, len(ratios) - 0.4)
    ax.set_ylabel("measured / predicted step time")
    ax.set_title("Collective steps: median and quartiles")
    return fig


def layers_table(frame: pd.DataFrame) -> Table:
    """Per layer: the measured best strategy, the predicted best, the measured cost of trusting the prediction, and
    (where the table records it) how many near-best contenders validate timed again. Strategies tied for the
    predicted best count as analysis.ranking counts them: the slowest measured of them is the pick, and the
    table says how many others tied. A measured best of 0 s leaves the regret n/a."""
    refined = "refined" in frame.columns
    rows = []
    for layer, part in frame.groupby("layer", sort=False):
        best = part.loc[part["measured_s"].idxmin()]
        tied = part[part["predicted_s"] == part["predicted_s"].min()]
        pick = tied.loc[tied["measured_s"].idxmax()]
        name = pick["strategy"] + (f" (tied with {len(tied) - 1} more)" if len(tied) > 1 else "")
        regret = f"{100 * (pick['measured_s'] / best['measured_s'] - 1):.1f}%" if best["measured_s"] > 0 else "n/a"
        rows.append((layer, str(len(part)), best["strategy"], f"{best['measured_s'] * MS:.4g}", name,
                     f"{pick['measured_s'] * MS:.4g}", regret,
                     *((str(int(part["refined"].sum())),) if refined else ())))
    return Table("Per layer", ("layer", "strategies", "measured best", "its time (ms)", "predicted best",
                               "its measured time (ms)", "regret", *(("contenders refined",) if refined else ())),
                 tuple(rows))


def _zeros(frame: pd.DataFrame) -> str:
    """A caption sentence naming the strategies a log axis cannot show (a time of zero)."""
    zero = frame[(frame["predicted_s"] <= 0) | (frame["measured_s"] <= 0)]
    if zero.empty:
        return ""
    return (f" Not drawn: {len(zero)} strategies with a time of 0 (layers "
            f"{', '.join(dict.fromkeys(zero['layer']))}), which a log axis cannot show.")


def section(val: Validation | None, root: Path) -> Section:
    title = "Validation"
    if val is None:
        return Section("validation", title, (Note("No validation given (--validation DIR): no predicted-vs-measured "
                                                  "strategy comparison or ranking accuracy."),))
    blocks = [Text(f"Strategies run for real by `commcal validate` ({val.path}), against the calibration's "
                   f"predictions.")]
    if val.info:
        blocks.append(Table("Validation run", ("field", "value"), tuple((k, str(v)) for k, v in val.info.items())))
    if val.meta:
        blocks += provenance.run_tables("validate", val.meta)
    blocks += [Note(n) for n in val.notes]
    if val.metrics and headline(val.metrics):
        blocks += [metrics_table(val.metrics),
                   save_figure(ranking_figure(val.metrics), root, "ranking-accuracy", "Ranking accuracy",
                               "How well the predicted order of strategies matches the measured order, end to end "
                               "and for communication alone, with 95% confidence intervals.")]
        if val.layers:
            blocks.append(per_layer_metrics_table(val.layers))
    elif val.metrics:
        blocks += [metrics_table(val.metrics), Note(f"{val.path}: none of {', '.join(METRICS)} has a value: "
                                                    "no ranking panel.")]
    else:
        blocks.append(Note(f"{val.path}: no ranking metrics (summary.json is missing or lists none)."))
    if val.by_link:
        blocks.append(link_table(val.by_link))
    if val.step_ratios:
        blocks += [step_ratio_table(val.step_ratios),
                   save_figure(step_ratio_figure(val.step_ratios), root, "step-ratios", "Where the error comes from",
                               "Measured over predicted time of each collective's steps per link class: the dot is "
                               "the median, the bar the quartiles; on the dashed line a step takes what the "
                               "calibration predicts.")]
        barless = [r.label for r in val.step_ratios if not r.bar]
        if barless:
            blocks.append(Note(f"{len(barless)} collective step ratio(s) drawn without quartile bars, quartiles that "
                               f"do not hold the median: {', '.join(barless)}."))
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
                           "predicted exactly." + _zeros(frame))]
    missing = [c for c in OPTIONAL if c not in frame.columns]
    if missing:
        blocks.append(Note(f"The strategies table has no {', '.join(missing)}: those parts are not drawn."))
    return Section("validation", title, tuple(blocks))
