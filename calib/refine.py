"""A spec's calibration refined by measurements of the machine (`commcal calibration from-spec SPEC --refine RUN...`):
every (operation, link class) the runs measure is priced by the model `commcal fit` fits from them, each GEMM dtype
and the local copy by the measured rate where measured, everything else by the spec; each model and rate names its
source (calibration version 15). Pure: no MPI. docs/training.md#refining-a-spec-with-measurements."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from calib.algorithms import P2P_OPS
from calib.fit import FitOptions, fit_result
from calib.points import RunSet
from calib.result import CalibrationResult, GemmRate, Source, p2p_of
from microbench.errors import UsageError
from microbench.ops import LOCAL_OPS

SPEC_LINKS = ("intra", "inter", "spread")
"""The link classes a spec prices (its first tier intra, its second inter and spread); a measured one replaces or
adds to the spec's, a switch level (inter2..inter9) has no place in a spec's flat machine."""


def refine(spec: CalibrationResult, runs: RunSet, opts: FitOptions = FitOptions()) -> CalibrationResult:
    """The spec's calibration with every model and rate the runs measure replaced by the fitted one; UsageError
    (one line) where the runs conflict with the spec or nothing in them can be fitted."""
    pts = runs.points
    _check_links(pts)
    measured = fit_result(runs, opts)
    _check_gemm(measured.gemm, spec.gemm, pts)
    if not (measured.models or measured.gemm or measured.copy):
        why = next(iter(measured.warnings), "no points")
        raise UsageError(f"runs {', '.join(r['run_id'] for r in runs.runs)}: nothing could be fitted ({why})")
    from_spec = Source("spec", tuple(spec.provenance["run_ids"]))
    models = {key: replace(m, source=from_spec) for key, m in spec.models.items()}
    comm = pts[~pts["op"].isin(LOCAL_OPS)]
    models.update({(op, link): replace(m, source=_measured(runs, comm[(comm["op"] == op) & (comm["link"] == link)]))
                   for (op, link), m in measured.models.items()})
    gemm, copy = _rates(spec, measured, runs, from_spec)
    links, notes = _merged_links(spec.link_classes, measured.link_classes)
    provenance = [*spec.provenance["runs"], *measured.provenance["runs"]]
    return CalibrationResult(
        created_utc=measured.created_utc, backend=spec.backend, fit=measured.fit,
        provenance={"run_ids": [r["run_id"] for r in provenance], "runs": provenance}, link_classes=links,
        models=models, hockney=measured.hockney, p2p=p2p_of(models, P2P_OPS), gemm=gemm,
        warnings=(_headline(spec, measured), *notes, *measured.warnings), copy=copy, memory_bytes=spec.memory_bytes)


def _measured(runs: RunSet, points: pd.DataFrame) -> Source:
    """The source of a fitted model or rate: the runs (in the order given) whose points it was fitted from."""
    used = set(points["run_id"])
    return Source("measured", tuple(dict.fromkeys(r["run_id"] for r in runs.runs if r["run_id"] in used)))


def _rates(spec: CalibrationResult, measured: CalibrationResult, runs: RunSet, from_spec: Source) -> tuple:
    """(GEMM rates by dtype, copy rate): the measured ones where the runs measured them, else the spec's."""
    pts = runs.points
    gemm = {dtype: replace(g, source=from_spec) for dtype, g in spec.gemm.items()}
    for dtype, g in measured.gemm.items():
        gemm[dtype] = _measured_gemm(g, spec.gemm[dtype],
                                     _measured(runs, pts[(pts["op"] == "gemm") & (pts["dtype"] == dtype)]))
    if measured.copy is not None:
        return gemm, replace(measured.copy, source=_measured(runs, pts[pts["op"] == "copy"]))
    return gemm, None if spec.copy is None else replace(spec.copy, source=from_spec)


def _measured_gemm(measured: GemmRate, spec: GemmRate, source: Source) -> GemmRate:
    """The measured GEMM rate, keeping the spec's wave (SMs and tile): a sweep measures the rate, not the tiling."""
    return replace(measured, wave_tiles=spec.wave_tiles, tile_rows=spec.tile_rows, tile_cols=spec.tile_cols,
                   source=source)


def _check_links(points: pd.DataFrame) -> None:
    """UsageError where a run measured a switch level (inter2..): a spec's machine is flat."""
    comm = points[~points["op"].isin(LOCAL_OPS)]
    other = comm[~comm["link"].isin(SPEC_LINKS)]
    if not other.empty:
        row = other.iloc[0]
        raise UsageError(f"run {row['run_id']} measured link class {row['link']} (a switch level); a spec prices "
                         f"only {', '.join(SPEC_LINKS)}: refine it with runs of those")


def _check_gemm(measured: dict, spec: dict, points: pd.DataFrame) -> None:
    """UsageError where a run measured GEMMs of a dtype the spec's device lacks, or faster than its peak: the
    measurement is of another device."""
    for dtype, g in measured.items():
        run = points.loc[(points["op"] == "gemm") & (points["dtype"] == dtype), "run_id"].iloc[0]
        if dtype not in spec:
            raise UsageError(f"run {run} measured {dtype} GEMMs, a dtype the spec states no peak for "
                             f"(device.peak_tflops: {', '.join(spec) or 'none'}): not the spec's device")
        if g.flops_per_s > spec[dtype].peak_flops_per_s:
            raise UsageError(f"run {run} measured {dtype} GEMMs at {g.flops_per_s / 1e12:.4g} TFLOP/s, above the "
                             f"spec's peak of {spec[dtype].peak_flops_per_s / 1e12:.4g}: not the spec's device")


def _merged_links(spec: dict, measured: dict) -> tuple[dict, list[str]]:
    """The link classes of the refined calibration, and a warning per class whose groups per node differ: a class
    both have keeps the spec's meaning and groups per node (its tier's sharing, which the spec's remaining models
    assume) with the process counts and shapes of both; a class only the runs measured is theirs."""
    out, notes = {link: dict(v) for link, v in spec.items()}, []
    for link, m in measured.items():
        if link not in spec:
            out[link] = dict(m)
            continue
        shapes = {s["procs"]: s for s in spec[link]["shapes"]} | {s["procs"]: s for s in m["shapes"]}
        rows = [shapes[p] for p in sorted(shapes)]
        out[link] = {**spec[link], "nodes": max(s["nodes"] for s in rows),
                     "ranks_per_node": max(s["ranks_per_node"] for s in rows), "procs": sorted(shapes),
                     "shapes": rows}
        if m["groups_per_node"] != spec[link]["groups_per_node"]:
            notes.append(f"{link}: measured with {m['groups_per_node']} group(s) per node at once, the spec's tier "
                         f"with {spec[link]['groups_per_node']}; the link class keeps the spec's count, so search "
                         f"shares the measured models' link as it shares the spec's")
    return out, notes


def _headline(spec: CalibrationResult, measured: CalibrationResult) -> str:
    """The refined calibration's first warning: which spec, which runs, and what they replaced."""
    what = [f"{op}/{link}" for op, link in measured.models] + [f"GEMM {dt}" for dt in measured.gemm]
    what += ["copy"] if measured.copy is not None else []
    return (f"from the hardware spec {spec.provenance['runs'][0]['dir']}, refined by the measured runs "
            f"{', '.join(measured.provenance['run_ids'])}: {', '.join(what)} measured, the rest from the spec "
            f"(each model's and rate's source)")
