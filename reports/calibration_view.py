"""The report's calibration section, read from a calibration's result (calib.result.CalibrationResult; the
functions also take a validated calibration dict): alpha/beta tables and heatmap, held-out error per operation, the
fit's warnings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.colors import LogNorm

from calib.result import CalibrationResult
from calib.tables import alpha_beta_frame
from microbench.sizes import format_size
from reports.document import Note, Section, Table, Text
from reports.plotting import COLORS, GB, US, log_values, new_figure, save_figure

HELDOUT_LABEL = "held-out |relative error| (%)"
COLOUR_RANGE = (1e-30, 1e30)
"""Values the heatmaps' log colour scales show (matplotlib's colour bar fails on values near the smallest float);
a cell outside it shows its number uncoloured."""


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _us(x: float) -> str:
    return f"{x * US:.3g}"


def _gbps(beta: float) -> str:
    """Bandwidth 1/beta in GB/s; beta <= 0 has no bandwidth."""
    return f"{1 / beta / GB:.3g}" if beta > 0 else "∞"


def alpha_beta_table(data) -> Table:
    """One row per model: the main ones (calls back to back), then the after-compute ones where the file has them."""
    res = CalibrationResult.of(data)
    rows = []
    for suffix, models in res.model_sets():
        context = f"after a {res.after_gemm}² GEMM" if suffix else "back to back"
        for (op, link), m in models.items():
            h = m.heldout
            rows.append((op, link, context, m.algorithm, _us(m.alpha_s),
                         f"{_us(m.alpha_ci95_s[0])} – {_us(m.alpha_ci95_s[1])}", _gbps(m.beta_s_per_byte),
                         f"{_gbps(m.beta_ci95_s_per_byte[1])} – {_gbps(m.beta_ci95_s_per_byte[0])}",
                         str(len(m.segments)), ", ".join(map(str, m.procs_measured)),
                         _pct(h.median_abs_rel_err), _pct(h.p90_abs_rel_err)))
    return Table("Alpha/beta per operation and link class (alpha of the smallest-size segment, "
                 "bandwidth 1/beta of the largest); calls after a computation by their own models where fitted",
                 ("operation", "link", "calls", "algorithm", "alpha (µs)", "alpha 95% CI (µs)", "1/beta (GB/s)",
                  "1/beta 95% CI (GB/s)", "segments", "procs measured", "held-out median |err|",
                  "held-out p90 |err|"), tuple(rows))


def segments_table(cal) -> Table:
    """Every model segment and every per-process-count Hockney line, from calib's tidy alpha/beta frame."""
    frame = alpha_beta_frame(cal)
    rows = tuple((r.table, r.op, r.link, str(r.procs), str(r.segment + 1),
                  f"{format_size(r.min_bytes)}–{format_size(r.max_bytes)}", _us(r.alpha_s),
                  f"{_us(r.alpha_ci95_low_s)} – {_us(r.alpha_ci95_high_s)}", _gbps(r.beta_s_per_byte),
                  f"{r.r2:.4f}", str(r.n_points)) for r in frame.itertuples())
    return Table("Model segments and Hockney lines per process count", (
        "table", "operation", "link", "procs", "segment", "sizes", "alpha (µs)", "alpha 95% CI (µs)",
        "1/beta (GB/s)", "R²", "points"), rows)


def p2p_table(res: CalibrationResult) -> Table:
    rows = [(op, link, _us(v.alpha_s), _gbps(v.beta_s_per_byte)) for op, by_link in res.p2p.items()
            for link, v in by_link.items()]
    return Table("Point-to-point alpha and bandwidth", ("operation", "link", "alpha (µs)", "1/beta (GB/s)"),
                 tuple(rows))


def compute_table(res: CalibrationResult) -> Table:
    rows = [(dtype, f"{v.flops_per_s / GB:.1f}", f"{v.peak_flops_per_s / GB:.1f}", format_size(v.saturation_bytes),
             f"{(v.latency_s or 0.0) * 1e6:.3g}", str(v.n_points)) for dtype, v in res.gemm.items()]
    return Table("GEMM rate", ("dtype", "rate (GFLOP/s)", "peak (GFLOP/s)", "saturates at", "latency (µs)", "points"),
                 tuple(rows))


def link_table(res: CalibrationResult) -> Table:
    rows = [(name, lc["meaning"], str(lc["nodes"]), str(lc["ranks_per_node"]), ", ".join(map(str, lc["procs"])))
            for name, lc in res.link_classes.items()]
    return Table("Link classes", ("link", "meaning", "nodes", "ranks per node", "procs"), tuple(rows))


def runs_table(res: CalibrationResult) -> Table:
    rows = [(r["run_id"], r["date"], r["machine"], ", ".join(r["hosts"]), r["mpi_library"],
             ", ".join(f"{k} {v}" for k, v in r["versions"].items())) for r in res.provenance["runs"]]
    return Table("Runs the calibration was fitted on", ("run", "date", "machine", "hosts", "MPI library",
                                                       "versions"), tuple(rows))


def warnings(res: CalibrationResult) -> list[str]:
    """The file's own warnings, then each model's (prefixed with op/link) that the file does not repeat."""
    per_model = (w if w.startswith(f"{op}/{link}:") else f"{op}/{link}: {w}"
                 for (op, link), m in res.models.items() for w in m.warnings)
    return list(dict.fromkeys([*res.warnings, *per_model]))


def grid(res: CalibrationResult, value) -> tuple[list[str], list[str], np.ndarray]:
    """(ops, columns, values[op, column]) with NaN where the calibration has no model: a column per link class,
    then one per link class of the after-compute models ("intra after compute") where the file has them."""
    cells = [(op, link + suffix, m) for suffix, models in res.model_sets() for (op, link), m in models.items()]
    ops = list(dict.fromkeys(op for op, _, _ in cells))
    columns = list(dict.fromkeys(col for _, col, _ in cells))
    vals = np.full((len(ops), len(columns)), np.nan)
    for op, col, m in cells:
        vals[ops.index(op), columns.index(col)] = value(m)
    return ops, columns, vals


def alpha_beta_heatmap(data):
    """Two heatmaps over operations x link classes (and after-compute models): alpha in µs and bandwidth 1/beta in
    GB/s (log colour)."""
    res = CalibrationResult.of(data)
    fig, axes = new_figure(11, 0.9 + 0.45 * max(3, len({op for op, _ in res.models})), ncols=2)
    for ax, (title, unit, value, cmap) in zip(axes, (
            ("alpha (latency term)", "µs", lambda m: m.alpha_s * US, "viridis_r"),
            ("1/beta (bandwidth term)", "GB/s", lambda m: 1 / m.beta_s_per_byte / GB
             if m.beta_s_per_byte > 0 else np.nan, "viridis"))):
        ops, links, vals = grid(res, value)
        shown = np.where((vals >= COLOUR_RANGE[0]) & (vals <= COLOUR_RANGE[1]), vals, np.nan)
        positive = shown[np.isfinite(shown)]
        norm = LogNorm(positive.min(), max(positive.max(), positive.min() * 1.01)) if positive.size else None
        image = ax.imshow(shown, cmap=cmap, norm=norm, aspect="auto")
        ax.grid(False)
        ax.set_xticks(range(len(links)), [c.replace(" ", "\n") for c in links])
        ax.set_yticks(range(len(ops)), ops)
        ax.set_xlabel("link class")
        ax.set_ylabel("operation")
        ax.set_title(f"{title} ({unit})")
        for (i, j), v in np.ndenumerate(vals):
            ax.text(j, i, "–" if np.isnan(v) else f"{v:.3g}", ha="center", va="center", fontsize=8,
                    color="black", bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.7))
        bar = fig.colorbar(image, ax=ax, label=unit)
        if norm is not None:
            log_values(bar.ax.yaxis)
    fig.suptitle("Fitted alpha and bandwidth by operation and link class", fontsize=12)
    return fig


def _percent(x) -> float:
    return np.nan if x is None else 100 * x


def heldout_figure(data):
    """Grouped bars per operation, one per link class (and after-compute model): cross-validated median |relative
    error|, p90 as a tick."""
    res = CalibrationResult.of(data)
    ops, links, med = grid(res, lambda m: _percent(m.heldout.median_abs_rel_err))
    _, _, p90 = grid(res, lambda m: _percent(m.heldout.p90_abs_rel_err))
    fig, (ax,) = new_figure(max(6.0, 1.1 * len(ops) + 2), 4.2)
    width = 0.8 / len(links)
    x = np.arange(len(ops))
    for j, link in enumerate(links):
        pos = x - 0.4 + width * (j + 0.5)
        ax.bar(pos, med[:, j], width * 0.9, color=COLORS[j % len(COLORS)], label=f"{link}: median")
        ax.plot(pos, p90[:, j], linestyle="none", marker="_", markersize=14, markeredgewidth=2,
                color=COLORS[j % len(COLORS)], label=f"{link}: p90")
    target = res.fit["target_median_abs_rel_err"]
    ax.axhline(100 * target, color="crimson", linestyle=":", label=f"target median ({100 * target:.0f}%)")
    ax.set_xticks(x, ops, rotation=20)
    ax.set_xlabel("operation")
    ax.set_ylabel(HELDOUT_LABEL)
    ax.set_title(f"Held-out error per operation ({res.fit['folds']}-fold cross-validation)")
    ax.legend(fontsize=8, ncols=2, loc="upper left")
    return fig


def section(cal, root: Path) -> Section:
    title = "Calibration"
    if cal is None:
        return Section("calibration", title, (Note("No calibration given (--calibration CAL): no alpha/beta "
                                                   "tables, held-out errors or fit warnings."),))
    res = cal.result
    fit = res.fit
    blocks = [Text(f"Calibration {cal.path or ''} for backend {res.backend}, created {res.created_utc} "
                   f"by commcal {fit['commcal_version']}: {fit['method']} fit, up to {fit['max_segments']} "
                   f"segment(s) per model, {fit['folds']}-fold held-out validation."),
              runs_table(res), link_table(res)]
    notes = warnings(res)
    if notes:
        blocks += [Note(f"The fit raised {len(notes)} warning(s): poor or unidentifiable models are listed below "
                        f"rather than hidden.", "warning"),
                   Table("Fit warnings", ("warning",), tuple((w,) for w in notes))]
    else:
        blocks.append(Note("The fit raised no warnings."))
    if not res.models:
        return Section("calibration", title, (*blocks, Note("The calibration holds no collective models.")))
    blocks += [alpha_beta_table(res),
               save_figure(alpha_beta_heatmap(res), root, "alpha-beta-heatmap", "Alpha and bandwidth heatmap",
                           "Fitted alpha (left, µs; smallest-size segment) and bandwidth 1/beta (right, GB/s; "
                           "largest-size segment) per operation and link class, the after-compute models in "
                           "columns of their own; – marks a combination the calibration does not model."),
               save_figure(heldout_figure(res), root, "heldout-error", "Held-out error per operation",
                           "Median absolute relative error of the model on sizes held out of the fit (bars) and "
                           "its 90th percentile (ticks), against the fit's target (dotted); after-compute models "
                           "beside the main ones."),
               segments_table(res)]
    if res.p2p:
        blocks.append(p2p_table(res))
    if res.gemm:
        blocks.append(compute_table(res))
    return Section("calibration", title, tuple(blocks))
