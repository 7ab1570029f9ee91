"""From sweep points to the calibration (calib.result.CalibrationResult): per (op, link) the algorithm model chosen by held-out error,
the per-process-count Hockney table, point-to-point link parameters, GEMM rates, and loud warnings."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from importlib import metadata

import numpy as np
import pandas as pd

from calib.algorithms import P2P_OPS, algorithm, candidates, distinguishable
from calib.result import (LAUNCH_WARN, AfterCompute, CalibrationResult, Candidate, CopyRate, GemmRate, HockneyRow,
                          LaunchSpread, Model, Speeds, p2p_of)
from calib.heldout import kfold_over_sizes
from calib.points import RunSet
from calib.regimes import change_warnings
from calib.segments import Points, change_points, fit_piecewise
from microbench.errors import UsageError
from microbench.links import meaning
from microbench.ops import LOCAL_OPS
from microbench.regimes import hidden_changes


@dataclass(frozen=True)
class FitOptions:
    method: str = "huber"              # "huber" (robust RLM) or "wls" (weights 1/t^2)
    folds: int = 5
    max_segments: int = 5
    min_sizes: tuple[int, ...] = (4, 3)
    """Fewest distinct sizes a segment may span: each is tried and held-out error chooses, per model (the first
    wins ties and segments the Hockney rows). 3 lets a short regime between two others have its own line, such
    as the 16-64 KiB stretch below a token bucket's burst on a rate-limited link."""
    target_median_abs_rel_err_ge_4KiB: float = 0.05
    target_median_abs_rel_err: float = 0.15


def _points(df: pd.DataFrame) -> Points:
    return Points.build(df["procs"], df["size_bytes"], df["seconds"], df["requested_bytes"])


def _fmt_range(seg) -> str:
    return f"{seg.min_bytes:g}..{seg.max_bytes:g} B"


OVERRIDE = (0.25, 0.005)
"""A fixed number of segments replaces the BIC's choice only when its held-out median error is lower by this share
and by this much: where BIC's segmentation is right, another number of segments still scores lower by chance, by a
share that grows as the errors shrink toward the noise, so both a relative and an absolute margin are needed to
keep chance from overriding it (the figures behind the thresholds: docs/results.md, "The held-out override of
BIC")."""


def _choose(alg, pts: Points, opts: FitOptions) -> tuple:
    """(held-out error, fit, min_sizes) of one algorithm: BIC's segmentation at the minimum segment size whose BIC
    predicts held-out sizes better (the first of equals), or, where a fixed number of segments up to
    opts.max_segments beats that segmentation's held-out error by both of OVERRIDE, the best of those. A misfit that
    no segmentation removes (a regime of fewer sizes than a segment needs, a one-size cliff) inflates BIC's residual
    variance for every segmentation alike, and it stops splitting. BIC's segmentation is scored at the number of
    segments BIC chose on all sizes, not at the folds' own choices: BIC on fewer sizes can split where BIC on all
    sizes does not, and its error would then be that of a model the fit never made."""
    @functools.cache                    # BIC's number of segments comes round again among the fixed numbers
    def scored(count, least):
        return kfold_over_sizes(alg, pts, opts.method, opts.max_segments, least, opts.folds, count), count, least

    def chosen(score):
        held, count, least = score
        return held, fit_piecewise(alg, pts, opts.method, opts.max_segments, least, count), least

    least = min((scored(None, least) for least in opts.min_sizes), key=lambda s: s[0].key())[2]
    bic = scored(len(change_points(alg, pts, opts.max_segments, least)), least)
    share, least_gain = OVERRIDE
    if bic[0].median is None or bic[0].median <= least_gain:
        return chosen(bic)
    fixed = [scored(count, least) for count in range(2, min(opts.max_segments, pts.n_sizes) + 1)
             for least in opts.min_sizes if count <= pts.n_sizes // least] + [scored(1, opts.min_sizes[0])]
    other = min(fixed, key=lambda s: s[0].key())
    gain = bic[0].median - (np.inf if other[0].median is None else other[0].median)
    return chosen(other if gain > max(share * bic[0].median, least_gain) else bic)


def launch_spread(df: pd.DataFrame) -> LaunchSpread | None:
    """The launch spread of one model's points: per (procs, size), the larger of the spread within a run (its sweep's
    launches) and between the runs fitted together; None where no point was measured in two launches or more."""
    rows = []
    for (procs, size), g in df.groupby(["procs", "size_bytes"]):
        launches = int(pd.to_numeric(g["launches"], errors="coerce").fillna(1).clip(lower=1).sum())
        within = pd.to_numeric(g["launch_spread"], errors="coerce").fillna(0.0).max()
        across = (g["seconds"].max() - g["seconds"].min()) / 2 / g["seconds"].median() if len(g) > 1 else 0.0
        if launches >= 2:
            rows.append((max(float(within), float(across)), launches, float(size), int(procs)))
    if not rows:
        return None
    spreads = np.array([r[0] for r in rows])
    worst = rows[int(np.argmax(spreads))]
    return LaunchSpread(max(r[1] for r in rows), len(rows), float(np.median(spreads)), worst[0], worst[2], worst[3])


def speeds(df: pd.DataFrame) -> Speeds | None:
    """The points of one model priced at the fastest of several speeds (calib.points `slow_ratio` > 1), with the
    largest such ratio at each size (1 where none), None where there are none."""
    if "slow_ratio" not in df:
        return None
    ratio = pd.to_numeric(df["slow_ratio"], errors="coerce")
    fast = ratio > 1
    if not fast.any():
        return None
    worst = df.loc[ratio.idxmax()]
    per_size = ratio.where(fast, 1.0).groupby(pd.to_numeric(df["size_bytes"])).max().sort_index()
    return Speeds(int(fast.sum()), len(df), float(ratio.max()), float(worst["size_bytes"]), int(worst["procs"]),
                  tuple(float(x) for x in per_size.index), tuple(float(x) for x in per_size))


def fit_model(op: str, link: str, df: pd.DataFrame, opts: FitOptions) -> tuple[Model | None, list[str]]:
    """The chosen model of one (op, link), and its warnings (None: too few points)."""
    tag = f"{op}/{link}"
    pts = _points(df)
    if pts.n_sizes < 3 or len(pts.seconds) < 3:
        return None, [f"{tag}: too few points to fit ({pts.n_sizes} sizes, {len(pts.seconds)} points); no model"]
    algs = candidates(op)
    identifiable = len(algs) == 1 or distinguishable(algs, pts.procs)
    choices = [_choose(alg, pts, opts) for alg in (algs if identifiable else algs[:1])]
    held, fit, least = min(choices, key=lambda s: s[0].key())
    chosen = fit.algorithm
    procs = sorted({int(p) for p in pts.procs})
    warnings = []
    if not identifiable:
        warnings.append(f"{tag}: algorithm not identifiable from process counts {procs} (every candidate fits "
                        f"alike); assumed {chosen.name}: extrapolation to other process counts is a guess")
    if pts.n_sizes < 2 * min(opts.min_sizes) and opts.max_segments > 1:
        warnings.append(f"{tag}: only {pts.n_sizes} sizes; change points not searched")
    for seg in fit.segments:
        if seg.alpha_s < 0:
            warnings.append(f"{tag}: negative alpha {seg.alpha_s:.3g} s over {_fmt_range(seg)}")
        if seg.beta_s_per_byte < 0:
            warnings.append(f"{tag}: negative beta {seg.beta_s_per_byte:.3g} s/B over {_fmt_range(seg)}")
    if held.median is None:
        warnings.append(f"{tag}: too few sizes for the held-out check")
    else:
        if held.median_ge_4KiB is not None and held.median_ge_4KiB > opts.target_median_abs_rel_err_ge_4KiB:
            warnings.append(f"{tag}: held-out median error {held.median_ge_4KiB:.1%} for sizes >= 4 KiB exceeds "
                            f"the {opts.target_median_abs_rel_err_ge_4KiB:.0%} target")
        if held.median > opts.target_median_abs_rel_err:
            warnings.append(f"{tag}: held-out median error {held.median:.1%} over all sizes exceeds the "
                            f"{opts.target_median_abs_rel_err:.0%} target")
    spread = launch_spread(df)
    if spread is not None and spread.max > LAUNCH_WARN:
        warnings.append(f"{tag}: points move between MPI launches by up to {spread.max:.0%} "
                        f"({spread.max_at_bytes:g} B, {spread.max_at_procs} ranks; median {spread.median:.1%} over "
                        f"{spread.n_points} points): the MPI library picks a mode per launch; the model prices their "
                        f"pooled median")
    fast = speeds(df)
    if fast is not None:
        warnings.append(f"{tag}: {fast.n_points} of {fast.of_points} points ran at several speeds (each held by a "
                        f"quarter of their calls, or a sustained fast minority); priced at the fastest, their slower "
                        f"calls up to "
                        f"{fast.max_ratio:.2f}x it ({fast.max_at_bytes:g} B, {fast.max_at_procs} ranks)")
    # an unidentifiable set was scored once: every candidate would have fitted and predicted alike
    by_name = {f.algorithm.name: (h, f) for h, f, _ in choices}
    cand = [Candidate(alg.name, h.median, h.p90, len(f.segments))
            for alg in algs for h, f in [by_name.get(alg.name, (held, fit))]]
    model = Model.build(chosen.name, chosen.description, procs, identifiable, opts.method,
                        [s.segment() for s in fit.segments], cand, held.result(), warnings, least, spread, fast)
    return model, warnings


def hockney_rows(op: str, link: str, df: pd.DataFrame, opts: FitOptions) -> tuple[list[HockneyRow], list[str]]:
    """t = alpha + beta n per process count (segmented like the models), one row per segment."""
    rows, warnings = [], []
    line = algorithm("hockney")
    for procs, sub in df.groupby("procs"):
        pts = _points(sub)
        if pts.n_sizes < 3:
            warnings.append(f"{op}/{link}/p{procs}: too few sizes ({pts.n_sizes}) for a Hockney fit")
            continue
        _, fit, _ = _choose(line, pts, opts)
        for i, s in enumerate(fit.segments):
            rows.append(HockneyRow(op, link, int(procs), i, s.min_bytes, s.max_bytes, s.alpha_s, s.se[0],
                                   tuple(s.ci95[0]), s.beta_s_per_byte, s.se[1], tuple(s.ci95[1]), s.r2, s.n_points))
    return rows, warnings


def gemm_rates(df: pd.DataFrame) -> dict[str, GemmRate]:
    """Per dtype: the saturated GEMM rate R (median over sizes reaching 90% of the peak), where it saturates,
    and the per-call latency L of t = L + flops / R: the relative-error weighted mean of t - flops / R (at
    least 0), so small products are not priced at nanoseconds where a call costs microseconds."""
    out = {}
    for dtype, sub in df.groupby("dtype"):
        seconds, flops = sub["seconds"].to_numpy(dtype=float), sub["flops"].to_numpy(dtype=float)
        rate = flops / seconds
        size = sub["size_bytes"].to_numpy(dtype=float)
        peak = float(rate.max())
        sat = rate >= 0.9 * peak
        flops_per_s = float(np.median(rate[sat]))
        weights = 1.0 / seconds ** 2
        latency = float(np.sum(weights * (seconds - flops / flops_per_s)) / np.sum(weights))
        out[str(dtype)] = GemmRate(flops_per_s, peak, float(size[sat].min()), int(len(rate)), max(latency, 0.0),
                                   int(sub["groups_per_node"].max()))
    return out


def copy_rate(df: pd.DataFrame) -> CopyRate | None:
    """The local copy's rate from copy points (None without any): t = latency + moved bytes / rate, moved bytes being
    read + written (twice the operand), fitted by least squares in relative error; latency at least 0."""
    if df.empty:
        return None
    seconds = df["seconds"].to_numpy(dtype=float)
    moved = 2.0 * df["size_bytes"].to_numpy(dtype=float)
    design = np.column_stack([np.ones_like(moved), moved]) / seconds[:, None]
    (latency, per_byte), *_ = np.linalg.lstsq(design, np.ones_like(seconds), rcond=None)
    if per_byte <= 0:              # too few or too noisy sizes: the largest size's plain rate
        latency, per_byte = 0.0, float(np.min(seconds[moved == moved.max()]) / moved.max())
    return CopyRate(1.0 / float(per_byte), max(float(latency), 0.0), int(len(seconds)),
                    int(df["groups_per_node"].max()))


def _link_classes(points: pd.DataFrame) -> dict:
    out = {}
    for link, sub in points[~points["op"].isin(LOCAL_OPS)].groupby("link"):
        shapes = sub[["procs", "nodes", "ranks_per_node"]].drop_duplicates().sort_values("procs")
        out[str(link)] = {"meaning": meaning(str(link)), "nodes": int(shapes["nodes"].max()),
                          "ranks_per_node": int(shapes["ranks_per_node"].max()),
                          "procs": sorted({int(p) for p in shapes["procs"]}),
                          "groups_per_node": int(sub["groups_per_node"].max()),
                          "shapes": [{k: int(v) for k, v in r.items()} for r in shapes.to_dict("records")]}
    return out


def _version() -> str:
    try:
        return metadata.version("commcal")
    except metadata.PackageNotFoundError:
        return "unknown"


def _fit_models(pts: pd.DataFrame, opts: FitOptions, hockney_table: bool = True) -> tuple[dict, list, list[str]]:
    """({(op, link): model}, Hockney rows, warnings) of the collectives and point-to-point operations in pts."""
    comm = pts[~pts["op"].isin(LOCAL_OPS)]
    models, hockney, warnings = {}, [], []
    for (op, link), df in comm.groupby(["op", "link"], sort=True):
        # one rank communicates with nobody: the algorithm shapes are 0 there, so only p > 1 fits a model
        shared = df if op in P2P_OPS else df[df["procs"] > 1]
        if shared.empty:
            warnings.append(f"{op}/{link}: only one process measured; no collective model (the Hockney table "
                            "has p=1)")
        else:
            model, why = fit_model(str(op), str(link), shared, opts)
            warnings += why
            if model is not None:
                models[(str(op), str(link))] = model
        if op not in P2P_OPS and hockney_table:
            rows, why = hockney_rows(str(op), str(link), df, opts)
            hockney += rows
            warnings += why
        warnings += change_warnings(hidden_changes(df))
    return models, hockney, warnings


def _after_compute(runs: RunSet, after: RunSet, opts: FitOptions) -> tuple[AfterCompute, list[str]]:
    """The calibration's after_compute section from sweeps with --after-gemm, and warnings; UsageError where
    those sweeps did not run a GEMM before each call or were measured unlike the main runs."""
    gemm = {r["after_gemm"] for r in after.runs}.pop()
    if gemm == 0:
        raise UsageError("--after-compute runs must come from sweeps with --after-gemm N (these ran no GEMM)")
    for name in ("cache", "gap_ms"):
        have, want = {r[name] for r in after.runs}, {r[name] for r in runs.runs}
        if have != want:
            raise UsageError(f"--after-compute runs differ from the main runs in {name} ({', '.join(map(str, have))} "
                             f"vs {', '.join(map(str, want))}); sweep them alike")
    if set(after.points["backend"]) != set(runs.points["backend"]):
        raise UsageError("--after-compute runs measured another backend than the main runs")
    groups = [p.groupby("link")["groups_per_node"].max() for p in (after.points, runs.points)]
    differ = [lk for lk in groups[0].index.intersection(groups[1].index) if groups[0][lk] != groups[1][lk]]
    if differ:
        raise UsageError(f"--after-compute runs measured {differ[0]} with {groups[0][differ[0]]} group(s) per node at "
                         f"once, the main runs with {groups[1][differ[0]]} (sweep --concurrent); sweep them alike")
    models, _, warnings = _fit_models(after.points, opts, hockney_table=False)
    if not models:
        raise UsageError("--after-compute runs hold no collective measured at more than one rank")
    return (AfterCompute(int(gemm), tuple(r["run_id"] for r in after.runs), models),
            [f"after compute: {w}" for w in (*after.notes, *warnings)])


def fit_result(runs: RunSet, opts: FitOptions = FitOptions(), after: RunSet | None = None) -> CalibrationResult:
    """The whole calibration (validated by the caller against the schema). `after`: runs of sweeps with
    --after-gemm, whose collectives become the after-compute models."""
    pts = runs.points
    models, hockney, warnings = _fit_models(pts, opts)
    warnings = list(runs.notes) + warnings
    after_models = None
    if after is not None:
        after_models, why = _after_compute(runs, after, opts)
        warnings += why
    all_runs = runs.runs + (after.runs if after is not None else ())
    return CalibrationResult(
        created_utc=datetime.now(timezone.utc).isoformat(), backend=str(pts["backend"].iloc[0]),
        fit={**{k: v for k, v in asdict(opts).items() if k != "min_sizes"}, "commcal_version": _version()},
        provenance={"run_ids": [r["run_id"] for r in all_runs], "runs": list(all_runs)},
        link_classes=_link_classes(pts), models=models, hockney=tuple(hockney), p2p=p2p_of(models, P2P_OPS),
        gemm=gemm_rates(pts[pts["op"] == "gemm"]), warnings=tuple(warnings), after_compute=after_models,
        copy=copy_rate(pts[pts["op"] == "copy"]), topology=runs.topology)
