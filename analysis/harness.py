"""The validation harness: runs each chosen strategy's schedule for real on every rank, checks outputs and
gradients against a single-process float64 reference, and times every step (barrier before each, max over
ranks, repeated until microbench.stats.StopRule says done, like the sweep)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from analysis.harness_exec import Program, Runner
from analysis.layers import Attention, Elementwise, Embedding, Layer, Linear, Schedule
from analysis.sbp import P, local_slices
from microbench.stats import Estimate, StopRule, estimate

TOLERANCE = {"float32": 1e-4, "float64": 1e-9}
"""Largest accepted max |got - reference| / max |reference| per output."""


class NumericsError(Exception):
    """A strategy's outputs or gradients differ from the reference: a bug, never a data point."""


@dataclass(frozen=True)
class Timed:
    """One strategy's measurement: per-iteration estimates and each item's median (seconds, max over ranks)."""

    total: Estimate
    comm: Estimate
    compute: Estimate
    item_median_s: tuple[float, ...]
    target_met: bool
    max_rel_err: float


def layer_data(layer: Layer, seed: int, dtype: str) -> dict:
    """Seeded global inputs, weights and output gradients of one layer, in `dtype`."""
    rng = np.random.default_rng(seed)
    shapes = {Linear: lambda l: {"X": l.in_shape, "W": (l.k, l.n), "dY": l.out_shape},
              Elementwise: lambda l: {"X": l.in_shape, "dY": l.out_shape},
              Attention: lambda l: {"X": l.in_shape, "dY": l.out_shape},
              Embedding: lambda l: {"W": (l.vocab, l.dim), "dY": l.out_shape}}[type(layer)](layer)
    out: dict = {name: rng.standard_normal(shape).astype(dtype) for name, shape in shapes.items()}
    out["seed"] = seed
    return out


def rel_errors(runner: Runner, prog: Program, env: dict) -> np.ndarray:
    """Each output's max |local - reference block| / max |reference| (partial sums reduced first; untimed)."""
    errs = []
    for out in prog.outputs:
        local = runner.xp.ascontiguousarray(env[out.name])
        for axis, p in enumerate(out.sig):
            if p == P:
                local = runner.coll.allreduce(local, axis)
        want = out.reference[local_slices(out.reference.shape, out.sig, runner.mesh.shape, runner.coord)]
        scale = max(float(np.abs(out.reference).max()), np.finfo(float).tiny)
        got = np.asarray(local.get() if hasattr(local, "get") else local, dtype=np.float64)
        errs.append(float(np.abs(got - want).max()) / scale if got.shape == want.shape else np.inf)
    return np.array(errs)


def measure(runner: Runner, prog: Program, rule: StopRule, dtype: str, what: str) -> Timed:
    """Check once (untimed), warm up, then time batches of iterations until the rule is met."""
    coll, items = runner.coll, prog.items
    comm = np.array([it.is_comm for it in items], dtype=bool)

    def once() -> tuple[dict, np.ndarray]:
        env = dict(prog.inputs)
        out = np.empty(len(items))
        for i, it in enumerate(items):
            coll.barrier()
            t0 = time.perf_counter()
            it.run(env)
            coll.sync()
            out[i] = time.perf_counter() - t0
        return env, out

    def batch(iters: int) -> tuple[np.ndarray, float]:
        t0 = time.perf_counter()
        rows = np.stack([once()[1] for _ in range(iters)])
        wall = np.full((1, len(items)), time.perf_counter() - t0)
        got = coll.world_max(np.concatenate([rows, wall]))
        return got[:-1], float(got[-1, 0])

    env, _ = once()
    errs = coll.world_max(rel_errors(runner, prog, env))
    bad = [(o.name, e) for o, e in zip(prog.outputs, errs) if not e <= TOLERANCE[dtype]]
    if bad:
        raise NumericsError(f"{what}: " + ", ".join(f"{n} max relative error {e:.3g}" for n, e in bad)
                            + f" > {TOLERANCE[dtype]:g} against the single-process reference")
    _, per_iter = batch(1)
    chunks, have, elapsed = [], 0, 0.0
    while True:
        iters = rule.next_batch(have, per_iter, elapsed)
        rows, wall = batch(iters)
        chunks.append(rows)
        have, elapsed, per_iter = have + iters, elapsed + wall, wall / iters
        est = estimate(np.concatenate(chunks).sum(axis=1))
        if rule.done(est, elapsed):
            break
    allrows = np.concatenate(chunks)
    return Timed(est, estimate(allrows[:, comm].sum(axis=1)), estimate(allrows[:, ~comm].sum(axis=1)),
                 tuple(float(v) for v in np.median(allrows, axis=0)),
                 est.samples >= rule.min_samples and est.within(rule.target_ci), float(errs.max(initial=0.0)))


def run_strategy(runner: Runner, layer: Layer, sched: Schedule, data: dict, dtype: str, rule: StopRule,
                 what: str) -> tuple[Program, Timed]:
    prog = runner.program(layer, sched, data, dtype)
    return prog, measure(runner, prog, rule, dtype, what)
