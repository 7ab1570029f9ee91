"""Which strategies `commcal validate` runs, checked before any rank starts: those --strategies picks (at least one per
layer), every one feasible on the mesh and
every collective priced on some link class; above --max-strategies, the predicted top half and a seeded sample
of the rest; and the contenders that the refinement passes time again. With --training, the training
configurations it runs."""

from __future__ import annotations

import numpy as np

from dataclasses import replace

from analysis.layers import Compute, Schedule
from analysis.models import Model
from analysis.paradl import PIPELINE, STRATEGIES, applicable, network_options
from analysis.options import nics_per_node
from analysis.pricing import Pricer
from analysis.schedules import Schedule as PipelineSchedule
from analysis.search import Tabulator
from analysis.redistribute import COLLECTIVES
from analysis.training import Config, divisors
from microbench.errors import UsageError


def check_feasible(name: str, opts, mesh_text: str) -> None:
    for sched in opts.schedules:
        if not sched.feasible:
            raise UsageError(f"layer {name} cannot run strategy {sched.strategy.id} on mesh {mesh_text}: "
                             f"{sched.reason}")


def check_links(name: str, runs: list[tuple[str, list]], pricer) -> None:
    """Every collective must have a model on some link class: a validation cannot score an infinite prediction.
    `runs`: (strategy id, its steps)."""
    for sid, steps in runs:
        for st in steps:
            if not isinstance(st, Compute) and st.is_comm and pricer.link(st.op, st.axis) is None:
                link = pricer.mesh.axes[st.axis].link
                raise UsageError(f"calibration {pricer.cal.path} has no {st.op} model on any link class (mesh axis "
                                 f"{st.axis} wants '{link}', {st.group_size} ranks), needed by {name} strategy "
                                 f"{sid}; sweep with --links {link}" + ("" if st.op in COLLECTIVES else
                                                                         f" --ops ...,{st.op}"))


def _network_strategies(selection, mesh) -> list[str]:
    """The ParaDL strategies --strategies names (each must apply on the mesh), or where it names none, every one
    that applies there (none where it names the pipeline alone, which analysis.validate_pipeline runs)."""
    here = applicable(mesh)
    names = [name for name in STRATEGIES if name in selection.names]
    if not names:
        return [] if PIPELINE in selection.names else here
    for name in names:
        if name not in here:
            raise UsageError(f"network strategy {name} does not run on a {len(mesh.shape)}-d mesh; there: "
                             f"{', '.join(here)}")
    return names


def choose(total_s: np.ndarray, most: int, seed: int) -> list[tuple[int, str]]:
    """(strategy index, why): all, or the predicted top half of `most` plus a seeded sample of the rest."""
    n = len(total_s)
    if n <= most:
        return [(i, "all") for i in range(n)]
    order = np.argsort(total_s, kind="stable")
    top = most - most // 2
    rest = np.random.default_rng(seed).choice(order[top:], size=most - top, replace=False)
    return [(int(i), "top") for i in order[:top]] + [(int(i), "sample") for i in sorted(rest)]


def contenders(times: list[np.ndarray], margin: float) -> list[int]:
    """Indices within (1 + margin) of the best of any of the given time columns (NaN: not ranked there), in
    index order: the strategies whose order decides a layer's top-1 and regret."""
    keep = np.zeros(len(times[0]), dtype=bool)
    for col in times:
        col = np.asarray(col, dtype=float)
        if np.isfinite(col).any():
            keep |= col <= np.nanmin(col) * (1 + margin)
    return [int(i) for i in np.flatnonzero(keep)]


def plan(args, cfg, layers: list, cal, mesh):
    """(pricer, [(name, layer, options, chosen strategies)]): every layer's strategies priced on `mesh` from the
    calibration and the ones to run chosen; all that validate does with the calibration before running anything,
    so a calibration it cannot use fails here, before MPI starts the harness."""
    pricer = Pricer(cal, mesh, args.dtype, nics_per_node(args), getattr(args, "profile_data", None))
    tab = Tabulator(pricer, cfg.selection)
    work = []
    for name, layer in layers:
        if isinstance(layer, Model):
            opts = network_options(layer, _network_strategies(cfg.selection, mesh), Tabulator(pricer))
            check_links(f"network {name}", [(s.id, opts.steps(i)) for i, s in enumerate(opts.strategies)], pricer)
        else:
            opts = tab.options(layer, True)
            if not opts.strategies:
                raise UsageError(f"layer {name} has none of the strategies --strategies {cfg.selection} picks on mesh "
                                 f"{'x'.join(map(str, mesh.shape))}")
            check_feasible(name, opts, "x".join(map(str, mesh.shape)))
            check_links(f"layer {name}", [(sc.strategy.id, sc.steps) for sc in opts.schedules], pricer)
        work.append((name, layer, opts, choose(opts.time_s, cfg.max_strategies, args.seed)))
    if cal.backend != args.backend:
        raise UsageError(f"calibration {args.calibration} was measured with backend {cal.backend!r}; "
                         f"--backend {args.backend} needs a calibration of the same backend")
    return pricer, work


def training_configs(devices: int) -> list[Config]:
    """The configurations `validate --training` runs by default: every (p, t, d) of the devices, each with 1F1B and
    micro-batches of 1 and of 2 sequences, interleaved (v = 2) where p > 1, and ZeRO 1 and DP overlap where d > 1
    (the model's problem() then drops those it cannot run)."""
    out = []
    for p in divisors(devices):
        for t in divisors(devices // p):
            base = Config(t, p, devices // (p * t), 1)
            out += [base, replace(base, micro_batch=2)]
            if p > 1:
                out.append(replace(base, schedule=PipelineSchedule("interleaved", 2)))
            if base.d > 1:
                out += [replace(base, zero=1), replace(base, dp_overlap=True)]
    return out
