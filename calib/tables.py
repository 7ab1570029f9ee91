"""The alpha/beta tables of a calibration as one tidy frame (chosen models and the per-process-count
Hockney lines), and its Markdown and CSV renderings for `commcal table`."""

from __future__ import annotations

import pandas as pd

from calib.result import CalibrationResult
from microbench.sizes import format_size

COLUMNS = ("table", "op", "link", "procs", "algorithm", "segment", "min_bytes", "max_bytes", "alpha_s",
           "alpha_ci95_low_s", "alpha_ci95_high_s", "beta_s_per_byte", "beta_ci95_low_s_per_byte",
           "beta_ci95_high_s_per_byte", "r2", "n_points", "heldout_median_abs_rel_err", "heldout_p90_abs_rel_err")


def _row(table, op, link, procs, alg, i, seg, held=None) -> dict:
    return {"table": table, "op": op, "link": link, "procs": procs, "algorithm": alg, "segment": i,
            "min_bytes": seg.min_bytes, "max_bytes": seg.max_bytes, "alpha_s": seg.alpha_s,
            "alpha_ci95_low_s": seg.alpha_ci95_s[0], "alpha_ci95_high_s": seg.alpha_ci95_s[1],
            "beta_s_per_byte": seg.beta_s_per_byte, "beta_ci95_low_s_per_byte": seg.beta_ci95_s_per_byte[0],
            "beta_ci95_high_s_per_byte": seg.beta_ci95_s_per_byte[1], "r2": seg.r2, "n_points": seg.n_points,
            "heldout_median_abs_rel_err": None if held is None else held.median_abs_rel_err,
            "heldout_p90_abs_rel_err": None if held is None else held.p90_abs_rel_err}


def alpha_beta_frame(cal) -> pd.DataFrame:
    """One row per segment of a calibration (a Calibration or a calib.result.CalibrationResult): table "model"
    (procs = the measured counts), "after_compute" (the models of collectives after a local computation, where
    the calibration has them) and "hockney" (one p)."""
    res = CalibrationResult.of(cal)
    rows = []
    for table, (_, models) in zip(("model", "after_compute"), res.model_sets()):
        for (op, link), m in sorted(models.items()):
            procs = ",".join(str(p) for p in m.procs_measured)
            rows += [_row(table, op, link, procs, m.algorithm, i, s, m.heldout) for i, s in enumerate(m.segments)]
    rows += [_row("hockney", h.op, h.link, str(h.procs), "hockney", h.segment, h) for h in res.hockney]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _us(x) -> str:
    return f"{x * 1e6:.3g}"


def _pct(x) -> str:
    return "" if x is None or pd.isna(x) else f"{x:.1%}"


def _md(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def markdown(cal) -> str:
    """Readable tables: alpha in microseconds, beta in ns/byte and the bandwidth 1/beta it means."""
    res = CalibrationResult.of(cal)
    frame = alpha_beta_frame(res)
    headers = ["op", "link", "procs", "algorithm", "sizes", "alpha us [95% CI]", "beta ns/B [95% CI]", "1/beta GB/s",
               "R^2", "held-out med/p90"]
    out = [f"# Calibration ({res.backend}; runs {', '.join(res.provenance['run_ids'])})"]
    after = f"{res.after_gemm}x{res.after_gemm} GEMM before each call"
    for table, title in (("model", "Collective models (t = a(p) alpha + b(p) n beta)"),
                         ("after_compute", f"Collective models after a local computation (sweeps with a {after})"),
                         ("hockney", "Hockney lines per process count (t = alpha + n beta)")):
        if table == "after_compute" and not res.after_gemm:
            continue
        rows = [[r.op, r.link, r.procs, r.algorithm, f"{format_size(r.min_bytes)}..{format_size(r.max_bytes)}",
                 f"{_us(r.alpha_s)} [{_us(r.alpha_ci95_low_s)}, {_us(r.alpha_ci95_high_s)}]",
                 f"{r.beta_s_per_byte * 1e9:.4g} [{r.beta_ci95_low_s_per_byte * 1e9:.4g}, "
                 f"{r.beta_ci95_high_s_per_byte * 1e9:.4g}]",
                 f"{1e-9 / r.beta_s_per_byte:.3g}" if r.beta_s_per_byte > 0 else "-", f"{r.r2:.4f}",
                 "" if table == "hockney" else
                 f"{_pct(r.heldout_median_abs_rel_err)} / {_pct(r.heldout_p90_abs_rel_err)}"]
                for r in frame[frame["table"] == table].itertuples()]
        out += ["", f"## {title}", "", _md(headers, rows) if rows else "(none)"]
    if res.gemm:
        out += ["", "## GEMM", "", _md(["dtype", "GFLOP/s (saturated)", "peak GFLOP/s", "saturates at", "latency us"],
                                       [[dt, f"{g.flops_per_s / 1e9:.4g}", f"{g.peak_flops_per_s / 1e9:.4g}",
                                         format_size(g.saturation_bytes), f"{(g.latency_s or 0.0) * 1e6:.3g}"]
                                        for dt, g in sorted(res.gemm.items())])]
    if res.warnings:
        out += ["", "## Warnings", ""] + [f"- {w}" for w in res.warnings]
    return "\n".join(out) + "\n"


def csv(cal) -> str:
    return alpha_beta_frame(cal).to_csv(index=False)
