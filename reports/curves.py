"""Per operation and link class: latency and bandwidth against size (measured medians with their CIs, and the
fitted model with its segments), and the model's relative error at each measured size."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from microbench.ops import OPS, gemm_flops, itemsize
from reports.plotting import COLORS, GB, US, bytes_axis, log_values, new_figure
from reports.runs import CURVE_KEYS, RunSet, curve_label

LATENCY_LABEL = "time per call (µs)"
BUSBW_LABEL = "bus bandwidth (GB/s)"
GFLOPS_LABEL = "compute rate (GFLOP/s)"
RESIDUAL_LABEL = "model error (measured − model) / model (%)"


@dataclass(frozen=True)
class ModelCurve:
    """The calibration's prediction along a dense size grid, with its 95% prediction interval."""

    sizes: np.ndarray
    seconds: np.ndarray
    low_s: np.ndarray
    high_s: np.ndarray
    extrapolated: np.ndarray


def model_curve(cal, op: str, link: str, procs: int, lo: float, hi: float, points: int = 160) -> ModelCurve:
    """Evaluate cal.predict on a log grid spanning [lo, hi] bytes."""
    sizes = np.unique(np.geomspace(lo, hi, points).round().astype(np.int64))
    preds = [cal.predict(op, link, procs, int(n)) for n in sizes]
    return ModelCurve(sizes,
                      np.array([p.seconds for p in preds]), np.array([p.low_s for p in preds]),
                      np.array([p.high_s for p in preds]), np.array([bool(p.extrapolated) for p in preds]))


def relative_error(cal, op: str, link: str, procs: int, rows: pd.DataFrame) -> pd.DataFrame:
    """Per measured size: (median - model)/model, and the same for the CI ends, as fractions; NaN where the model
    prices the size at 0 (a negative alpha clipped), which no relative error describes."""
    model = np.array([cal.predict(op, link, procs, int(n)).seconds for n in rows["size_bytes"]])
    model = np.where(model > 0, model, np.nan)
    return pd.DataFrame({"size_bytes": rows["size_bytes"].to_numpy(),
                         "rel": rows["median_s"].to_numpy() / model - 1,
                         "rel_low": rows["ci_low_s"].to_numpy() / model - 1,
                         "rel_high": rows["ci_high_s"].to_numpy() / model - 1})


def _rate(key: dict, sizes, seconds) -> np.ndarray:
    """Bus bandwidth in GB/s for communication (bytes moved for copy); GFLOP/s for gemm, whose size is one
    n x n operand. NaN where the time is not positive (a prediction interval's lower end can reach zero: no
    finite rate bounds it)."""
    sizes, seconds = np.asarray(sizes, float), np.asarray(seconds, float)
    seconds = np.where(seconds > 0, seconds, np.nan)
    if key["op"] == "gemm":
        n = np.sqrt(sizes / itemsize(key["dtype"]))
        return gemm_flops(n) / seconds / GB
    return sizes * OPS[key["op"]].bus_factor(key["procs"]) / seconds / GB


def segment_ranges(cal, op: str, link: str) -> list[tuple[float, float]]:
    """The measured size range each piece of the (op, link) model was fitted on, from the calibration file."""
    return [(s.min_bytes, s.max_bytes) for s in cal.result.models[(op, link)].segments]


def _draw_segments(axes, ranges: list[tuple[float, float]]) -> None:
    """Shade each fitted segment's size range, alternating, and number it along the top of each panel."""
    if len(ranges) < 2:
        return
    for ax in axes:
        for k, (lo, hi) in enumerate(ranges):
            ax.axvspan(lo, hi, color="0.5" if k % 2 else "0.8", alpha=0.13, linewidth=0, label="_segment")
            ax.text((lo * hi) ** 0.5, 0.98, f"seg {k + 1}", transform=ax.get_xaxis_transform(),
                    ha="center", va="top", fontsize=7, color="0.35")


def _draw_model(ax_t, ax_b, mc: ModelCurve, key: dict, color) -> None:
    """Solid where the model is fitted, dashed where it extrapolates; the band is its 95% prediction interval."""
    for ax, y, lo, hi in ((ax_t, mc.seconds * US, mc.low_s * US, mc.high_s * US),
                          (ax_b, _rate(key, mc.sizes, mc.seconds),
                           _rate(key, mc.sizes, mc.high_s), _rate(key, mc.sizes, mc.low_s))):
        ax.fill_between(mc.sizes, lo, hi, color=color, alpha=0.12, linewidth=0)
        inside = np.where(mc.extrapolated, np.nan, y)
        outside = np.where(mc.extrapolated | np.roll(mc.extrapolated, 1) | np.roll(mc.extrapolated, -1), y, np.nan)
        ax.plot(mc.sizes, inside, color=color, linewidth=1.6, label="_model")
        ax.plot(mc.sizes, outside, color=color, linewidth=1.2, linestyle="--", label="_extrapolated")


def measured_figure(runs: RunSet, op: str, link: str, cal=None):
    """Latency and rate panels (plus a residual panel when a calibration models this op and link)."""
    curves = runs.curves(op, link)
    varying = {k for k in CURVE_KEYS if len({str(key[k]) for key, _ in curves}) > 1}
    modelled = cal is not None and cal.has(op, link)
    fig, axes = new_figure(15 if modelled else 10.5, 4.4, ncols=3 if modelled else 2)
    ax_t, ax_b = axes[0], axes[1]
    compute, flops = OPS[op].kind == "compute", op == "gemm"
    for i, (key, rows) in enumerate(curves):
        color = COLORS[i % len(COLORS)]
        label = curve_label(key, varying)
        x = rows["size_bytes"].to_numpy()
        med, lo, hi = (rows[c].to_numpy() for c in ("median_s", "ci_low_s", "ci_high_s"))
        ax_t.errorbar(x, med * US, yerr=[(med - lo) * US, (hi - med) * US], color=color, marker="o",
                      markersize=4, linestyle="none" if modelled else "-", linewidth=1, capsize=2, label=label)
        rate = _rate(key, x, med)
        rate_lo, rate_hi = rate * med / hi, rate * med / lo
        ax_b.errorbar(x, rate, yerr=[rate - rate_lo, rate_hi - rate], color=color, marker="o", markersize=4,
                      linestyle="none" if modelled else "-", linewidth=1, capsize=2, label=label)
        if modelled:
            mc = model_curve(cal, op, link, key["procs"], x.min() / 2, x.max() * 2)
            _draw_model(ax_t, ax_b, mc, key, color)
            err = relative_error(cal, op, link, key["procs"], rows)
            axes[2].errorbar(err["size_bytes"], err["rel"] * 100,
                             yerr=[(err["rel"] - err["rel_low"]) * 100, (err["rel_high"] - err["rel"]) * 100],
                             color=color, marker="o", markersize=4, linewidth=1, capsize=2, label=label)
    size_label = "operand size (bytes)" if compute else "message size (bytes)"
    for ax in axes:
        bytes_axis(ax, size_label)
    log_values(ax_t.yaxis)
    ax_t.set_ylabel(LATENCY_LABEL)
    ax_t.set_title("Latency")
    log_values(ax_b.yaxis)
    ax_b.set_ylabel(GFLOPS_LABEL if flops else BUSBW_LABEL)
    ax_b.set_title("Compute rate" if flops else "Bus bandwidth")
    rates = cal.result.gemm if cal is not None and flops else {}
    for i, (key, _) in enumerate(curves):
        if key["dtype"] in rates:
            ax_b.axhline(rates[key["dtype"]].flops_per_s / GB, color=COLORS[i % len(COLORS)], linewidth=1.4,
                         linestyle=":", label=f"calibrated rate, {key['dtype']}")
    handles, labels = ax_b.get_legend_handles_labels()
    if modelled:
        _draw_segments(axes, segment_ranges(cal, op, link))
        handles += [Line2D([], [], color="gray", linewidth=1.6), Line2D([], [], color="gray", linestyle="--")]
        labels += ["fitted model (band: 95% PI)", "model, extrapolated"]
        res = axes[2]
        res.axhline(0, color="black", linewidth=0.8)
        res.set_ylabel(RESIDUAL_LABEL)
        res.set_title("Residuals")
        res.set_xlim(ax_t.get_xlim())
    fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize=8,
               title="points: measured median with its 95% CI", title_fontsize=8)
    fig.suptitle(f"{op} over {link} links", fontsize=13)
    return fig
