"""What changed between two calibrations of a machine: each model's alpha and bandwidth (1/beta) and its algorithm,
the after-compute models' too where either file has them, and the GEMM rates; relative change, and whether the new
value left the old one's 95% CI (or the reverse)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from calib.result import CalibrationResult, Model
from reports.document import Table
from reports.plotting import COLORS, GB, US, new_figure

CHANGE_LABEL = "change from A to B (%)"
SHOWN_PCT = 1000.0
"""The farthest the figure's bars and bands reach (%); a larger change stops at the edge with its number beside it:
more than tenfold needs no scale to be seen, and a change of a huge or tiny parameter would leave none."""


@dataclass(frozen=True)
class Change:
    """One parameter in A and B (display units), with 95% CIs where the calibration gives them."""

    subject: str                    # "allreduce/intra", "allreduce/intra after compute", "gemm/float32"
    parameter: str                  # "alpha (µs)", "bandwidth 1/beta (GB/s)", "algorithm", "rate (GFLOP/s)"
    a: float | str | None           # None: not in that calibration
    b: float | str | None
    a_ci: tuple[float, float] | None = None
    b_ci: tuple[float, float] | None = None

    @property
    def relative(self) -> float | None:
        """b / a - 1; None where that is no finite number (a text, a missing side, a zero or infinite value)."""
        if isinstance(self.a, float) and isinstance(self.b, float) and self.a != 0:
            rel = self.b / self.a - 1
            return rel if np.isfinite(rel) else None
        return None

    @property
    def significant(self) -> bool:
        """Changed beyond noise: B outside A's CI or A outside B's (any change without CIs; a model
        present in one only; a different algorithm)."""
        if not (isinstance(self.a, float) and isinstance(self.b, float)):
            return self.a != self.b
        if self.a_ci is None or self.b_ci is None:
            return self.a != self.b
        return not (self.a_ci[0] <= self.b <= self.a_ci[1]) or not (self.b_ci[0] <= self.a <= self.b_ci[1])


def _bandwidth(beta: float) -> float:
    return 1 / beta / GB if beta > 0 else float("inf")


def _model_params(m: Model) -> dict[str, tuple]:
    lo, hi = m.beta_ci95_s_per_byte
    return {"alpha (µs)": (m.alpha_s * US, (m.alpha_ci95_s[0] * US, m.alpha_ci95_s[1] * US)),
            "bandwidth 1/beta (GB/s)": (_bandwidth(m.beta_s_per_byte), (_bandwidth(hi), _bandwidth(lo))),
            "algorithm": (m.algorithm, None)}


def changes(a, b) -> list[Change]:
    """Every compared parameter of calibrations A and B (results, or calibration dicts): models in A's order then
    those new in B (the main models, then the after-compute ones), then GEMM rates."""
    a, b = CalibrationResult.of(a), CalibrationResult.of(b)
    out = []
    sets_a, sets_b = dict(a.model_sets()), dict(b.model_sets())
    for suffix in dict.fromkeys([*sets_a, *sets_b]):
        ms_a, ms_b = sets_a.get(suffix, {}), sets_b.get(suffix, {})
        for op, link in dict.fromkeys([*ms_a, *ms_b]):
            ma, mb = ms_a.get((op, link)), ms_b.get((op, link))
            pa = _model_params(ma) if ma else {}
            pb = _model_params(mb) if mb else {}
            for name in ("alpha (µs)", "bandwidth 1/beta (GB/s)", "algorithm"):
                va, ca = pa.get(name, (None, None))
                vb, cb = pb.get(name, (None, None))
                out.append(Change(f"{op}/{link}{suffix}", name, va, vb, ca, cb))
    for dtype in dict.fromkeys([*a.gemm, *b.gemm]):
        ga, gb = a.gemm.get(dtype), b.gemm.get(dtype)
        out.append(Change(f"gemm/{dtype}", "rate (GFLOP/s)", ga and ga.flops_per_s / GB, gb and gb.flops_per_s / GB))
    return out


def _fmt(v) -> str:
    return "—" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def _verdict(c: Change) -> str:
    if c.a is None or c.b is None:
        return "only in B" if c.a is None else "only in A"
    return "CHANGED" if c.significant else ""


def table(items: list[Change]) -> Table:
    rows = tuple((c.subject, c.parameter, _fmt(c.a), _fmt(c.b),
                  "—" if c.relative is None else f"{100 * c.relative:+.1f}%",
                  "—" if c.a_ci is None else f"{c.a_ci[0]:.4g} – {c.a_ci[1]:.4g}",
                  "—" if c.b_ci is None else f"{c.b_ci[0]:.4g} – {c.b_ci[1]:.4g}",
                  _verdict(c)) for c in items)
    return Table("Parameters of A and B", ("model", "parameter", "A", "B", "change", "A 95% CI", "B 95% CI",
                                           "beyond CI"), rows)


def figure(items: list[Change]):
    """One panel per numeric parameter: horizontal bars of relative change, red where beyond the CIs, with A's
    own CI (relative to A) as a grey band: the change a re-measurement could show by chance."""
    params = list(dict.fromkeys(c.parameter for c in items if c.relative is not None))
    switched = {c.subject: f" ({c.a} → {c.b})" for c in items if c.parameter == "algorithm" and c.significant}
    rows = max([sum(c.parameter == p and c.relative is not None for c in items) for p in params] or [1])
    fig, axes = new_figure(5.2 * max(1, len(params)), 1.4 + 0.38 * rows, ncols=max(1, len(params)))
    for ax, param in zip(axes, params):
        sel = [c for c in items if c.parameter == param and c.relative is not None]
        y = np.arange(len(sel))[::-1]
        rel = np.array([100 * c.relative for c in sel])
        drawn = np.clip(rel, -SHOWN_PCT, SHOWN_PCT)
        bands = [(yi, *np.clip(100 * (np.array(c.a_ci) / c.a - 1), -SHOWN_PCT, SHOWN_PCT)) for yi, c in zip(y, sel)
                 if c.a_ci is not None and np.isfinite(c.a_ci).all()]
        for yi, lo, hi in bands:
            ax.fill_betweenx([yi - 0.4, yi + 0.4], lo, hi, color="0.85", linewidth=0)
        colors = [COLORS[3] if c.significant else COLORS[7] for c in sel]
        ax.barh(y, drawn, 0.55, color=colors)
        for yi, r, x in zip(y, rel, drawn):
            ax.annotate(f"{r:+.1f}%", (x, yi), xytext=(4 if r >= 0 else -4, 0), textcoords="offset points",
                        ha="left" if r >= 0 else "right", va="center", fontsize=8)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_yticks(y, [c.subject + switched.get(c.subject, "") for c in sel])
        ax.set_xlabel(CHANGE_LABEL)
        ax.set_title(param)
        span = max(5.0, np.abs(drawn).max() * 1.35, *(1.1 * max(abs(lo), abs(hi)) for _, lo, hi in bands))
        ax.set_xlim(-span, span)
    if not params:
        axes[0].text(0.5, 0.5, "no numeric parameter in common", ha="center", va="center",
                     transform=axes[0].transAxes)
        axes[0].set_xlabel(CHANGE_LABEL)
    fig.suptitle("Calibration B against A (red: beyond the 95% CIs; grey band: A's CI; (x → y): algorithm changed)",
                 fontsize=11)
    return fig
