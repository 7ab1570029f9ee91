"""Known-truth inputs: calibrations (calib.result) built from given alpha/beta (for analysis' tests) and sweep run
directories in the exact microbench/records.py format sampled from known models with noise (for the fit's)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from calib.algorithms import CANDIDATES, P2P_OPS, algorithm
from calib.result import (AfterCompute, CalibrationResult, Candidate, GemmRate, HeldOut, Model, p2p_of)
from calib.result import Segment as FitSegment
from microbench import records
from microbench.links import link_level, meaning
from microbench.atomic import atomic_write, atomic_write_json, atomic_write_text
from microbench.ops import COMM_DTYPE, OPS, gemm_flops, itemsize

DEFAULT_SIZES = tuple(2 ** k for k in range(3, 27))        # 8 B .. 64 MiB


@dataclass(frozen=True)
class Segment:
    """alpha/beta that hold for sizes below upto_bytes (math.inf for the last segment)."""

    upto_bytes: float
    alpha_s: float
    beta_s_per_byte: float


@dataclass(frozen=True)
class TrueModel:
    """A known (possibly piecewise) algorithm model: t = a(p) alpha + b(p) n beta per segment."""

    segments: tuple[Segment, ...]
    algorithm: str | None = None          # None: the operation's first (default) candidate

    @classmethod
    def line(cls, alpha_s: float, beta_s_per_byte: float, algorithm: str | None = None) -> "TrueModel":
        return cls((Segment(math.inf, alpha_s, beta_s_per_byte),), algorithm)

    def algorithm_for(self, op: str) -> str:
        return self.algorithm or CANDIDATES[op][0]

    def seconds(self, op: str, procs: int, nbytes) -> np.ndarray:
        nbytes = np.asarray(nbytes, dtype=float)
        uptos = np.array([s.upto_bytes for s in self.segments[:-1]], dtype=float)
        seg = np.searchsorted(uptos, nbytes, side="right")
        alpha = np.array([s.alpha_s for s in self.segments])[seg]
        beta = np.array([s.beta_s_per_byte for s in self.segments])[seg]
        a, b = algorithm(self.algorithm_for(op)).coefficients(2 if op in P2P_OPS else procs)
        return a * alpha + b * nbytes * beta


def link_shape(link: str, procs: int) -> tuple[int, int]:
    """(nodes, ranks_per_node) of a link class at p ranks: intra one node, inter and the switch levels one rank
    per node, spread two nodes."""
    if link == "intra":
        return 1, procs
    if link_level(link):
        return procs, 1
    return 2, max(1, procs // 2)


def _as_model(spec) -> TrueModel:
    return spec if isinstance(spec, TrueModel) else TrueModel.line(*spec)


def synthetic_result(models: dict, links: dict[str, list[int]] | None = None,
                     gemm: dict[str, float] | None = None, backend: str = "mpi",
                     sizes: tuple[int, ...] = DEFAULT_SIZES, after_compute: dict | None = None,
                     topology: dict | None = None) -> CalibrationResult:
    """A calibration of exactly the given models. models: {(op, link): TrueModel or (alpha_s, beta_s_per_byte)};
    links: {link: [process counts measured]} (default: each model's link at p = 2, 4, 8);
    gemm: {dtype: FLOP/s}; after_compute: models as `models`, for collectives after a local computation;
    topology: the switch levels (microbench.switches.Topology.to_json)."""
    links = links or {link: [2, 4, 8] for _, link in models}
    out_models = exact_models(models, links, sizes)
    after = None if not after_compute else AfterCompute(384, ("synthetic-after",),
                                                        exact_models(after_compute, links, sizes))
    link_classes = {}
    for link, procs in links.items():
        shapes = [dict(zip(("procs", "nodes", "ranks_per_node"), (p, *link_shape(link, p)))) for p in sorted(procs)]
        link_classes[link] = {"meaning": meaning(link), "nodes": max(s["nodes"] for s in shapes),
                              "ranks_per_node": max(s["ranks_per_node"] for s in shapes),
                              "procs": sorted(procs), "shapes": shapes}
    return CalibrationResult(
        created_utc=datetime.now(timezone.utc).isoformat(), backend=backend,
        fit={"method": "wls", "folds": 0, "max_segments": 1, "target_median_abs_rel_err_ge_4KiB": 0.05,
             "target_median_abs_rel_err": 0.15, "commcal_version": "synthetic"},
        provenance={"run_ids": ["synthetic"], "runs": []}, link_classes=link_classes, models=out_models, hockney=(),
        p2p=p2p_of(out_models, P2P_OPS), gemm={dt: GemmRate(float(r), float(r), 0.0, 1) for dt, r in (gemm or {}).items()},
        warnings=("synthetic calibration, not fitted from measurements",), after_compute=after, topology=topology)


def synthetic_calibration(models: dict, links: dict[str, list[int]] | None = None,
                          gemm: dict[str, float] | None = None, backend: str = "mpi",
                          sizes: tuple[int, ...] = DEFAULT_SIZES, after_compute: dict | None = None,
                          topology: dict | None = None) -> dict:
    """synthetic_result as a valid calibration dict."""
    return synthetic_result(models, links, gemm, backend, sizes, after_compute, topology).to_json()


def exact_models(models: dict, links: dict[str, list[int]], sizes: tuple[int, ...],
                 note: str = "synthetic model, not fitted") -> dict[tuple[str, str], Model]:
    """{(op, link): model}, exactly the given models over the sizes, each carrying `note` as its warning."""
    lo, hi = float(min(sizes)), float(max(sizes))
    out_models = {}
    for (op, link), spec in models.items():
        m = _as_model(spec)
        segs = []
        for i, s in enumerate(m.segments):
            seg_lo = lo if i == 0 else float(m.segments[i - 1].upto_bytes)
            seg_hi = hi if i == len(m.segments) - 1 else float(s.upto_bytes)
            segs.append(FitSegment(seg_lo, seg_hi, s.alpha_s, 0.0, (s.alpha_s, s.alpha_s), s.beta_s_per_byte, 0.0,
                                   (s.beta_s_per_byte,) * 2, 0.0, 0.0, 1.0, 2, 2))
        alg = m.algorithm_for(op)
        out_models[(op, link)] = Model.build(
            alg, algorithm(alg).description, sorted(links[link]) if op not in P2P_OPS else [2], True, "wls", segs,
            [Candidate(alg, 0.0, 0.0, len(segs))], HeldOut(0, 0, None, None, None, None),
            [note])
    return out_models


def _summary_row(run_id: str, backend: str, op: str, link: str, procs: int, requested: int, dtype: str,
                 times: np.ndarray) -> dict:
    spec = OPS[op]
    lay = spec.layout(requested, procs, itemsize(dtype))
    nodes, rpn = link_shape(link, procs)
    key = records.PointKey(backend, op, link, procs, requested, dtype)
    med = float(np.median(times))
    flops = gemm_flops(lay.block) if op == "gemm" else 0.0
    lo, hi = np.quantile(times, [0.25, 0.75])
    return records.PointSummary(
        run_id=run_id, point_id=key.point_id, backend=backend, op=op, link=link, nodes=nodes, ranks_per_node=rpn,
        procs=procs, requested_bytes=requested, size_bytes=lay.size_bytes, count=lay.send_count, dtype=dtype,
        bytes_per_rank=spec.bytes_per_rank(lay.size_bytes, procs), in_place=False, timing_path="c",
        samples=len(times), median_s=med, ci_low_s=float(lo), ci_high_s=float(hi), min_s=float(times.min()),
        p95_s=float(np.quantile(times, 0.95)), mean_s=float(times.mean()), target_ci=0.02, target_met=True,
        algbw_Bps=lay.size_bytes / med, busbw_Bps=lay.size_bytes / med * spec.bus_factor(procs), wrong=0,
        flops=flops, flops_per_s=flops / med if flops else 0.0).to_dict()


def write_synthetic_run(out_dir, models: dict, procs: dict[str, list[int]], sizes=DEFAULT_SIZES,
                        samples: int = 15, noise: float = 0.01, outlier_fraction: float = 0.0,
                        bad_points: int = 0, gemm: dict[str, float] | None = None,
                        copy: tuple[float, float] | None = None, seed: int = 0,
                        run_id: str = "synthetic-run", backend: str = "mpi", consolidate: bool = True,
                        write_points: bool = True, options: dict | None = None) -> Path:
    """Write a run directory sampled from known models. models: {(op, link): TrueModel or (alpha, beta)};
    procs: {link: [p, ...]}; gemm: {dtype: peak FLOP/s} (time = 2 n^3 / peak + 5 us); copy: (latency s,
    bytes read + written per s) of the local copy, float32. Each sample is the
    truth times lognormal(noise); outlier_fraction of samples are slowed 1.5-5x; bad_points whole points
    are slowed 1.5-3x. consolidate=False leaves only points/, like a run that was killed. options: run.json's
sweep options (the conditions, such as after_gemm)."""
    out = Path(out_dir)
    rng = np.random.default_rng(seed)
    plan = []
    for (op, link), spec in models.items():
        m = _as_model(spec)
        for p in ([2] if op in P2P_OPS else procs[link]):
            for n in sizes:
                size = OPS[op].layout(n, p, itemsize(COMM_DTYPE)).size_bytes
                plan.append((op, link, p, n, COMM_DTYPE, float(m.seconds(op, p, size))))
    for dtype, peak in (gemm or {}).items():
        for n in sizes:
            lay = OPS["gemm"].layout(n, 1, itemsize(dtype))
            plan.append(("gemm", "intra", 1, n, dtype, gemm_flops(lay.block) / peak + 5e-6))
    if copy is not None:
        for n in sizes:
            moved = 2 * OPS["copy"].layout(n, 1, itemsize(COMM_DTYPE)).size_bytes
            plan.append(("copy", "intra", 1, n, COMM_DTYPE, copy[0] + moved / copy[1]))
    slow = set(rng.choice(len(plan), size=min(bad_points, len(plan)), replace=False).tolist()) if bad_points else set()
    rows, frames = [], []
    for i, (op, link, p, n, dtype, truth) in enumerate(plan):
        t = truth * rng.lognormal(0.0, noise, samples)
        hit = rng.random(samples) < outlier_fraction
        t[hit] *= rng.uniform(1.5, 5.0, hit.sum())
        if i in slow:
            t *= rng.uniform(1.5, 3.0)
        row = _summary_row(run_id, backend, op, link, p, n, dtype, t)
        rows.append(row)
        frames.append(pd.DataFrame({"run_id": run_id, "point_id": row["point_id"],
                                    "iteration": np.arange(samples), "time_s": t}))
    hosts = [f"node{k}" for k in range(max(max(link_shape(l, p)[0] for p in ps) for l, ps in procs.items()))]
    atomic_write_json(out / "run.json", {
        "schema": records.RUN_SCHEMA, "version": records.RUN_SCHEMA_VERSION, "run_id": run_id, "backend": backend,
        "start_time": datetime.now(timezone.utc).isoformat(), "machine": "synthetic", "hosts": hosts,
        "mpi_library_version": "synthetic MPI 0.0", "versions": {"commcal": "synthetic"}, "options": options or {}})
    if write_points:
        for row, frame in zip(rows, frames):
            atomic_write(out / "points" / f"{row['point_id']}.parquet", frame.to_parquet)
            atomic_write_text(out / "points" / f"{row['point_id']}.json", json.dumps(row))
    if consolidate:
        summary = pd.DataFrame(rows, columns=list(records.SUMMARY_COLUMNS))
        atomic_write(out / "summary.parquet", summary.to_parquet)
        atomic_write(out / "summary.csv", lambda tmp: summary.to_csv(tmp, index=False))
        atomic_write(out / "samples.parquet", pd.concat(frames, ignore_index=True).to_parquet)
    return out
