"""The validation harness: runs each chosen strategy's schedule for real on every rank, checks outputs and
gradients against a single-process float64 reference, and times every step (barrier before each, max over
ranks, repeated until microbench.stats.StopRule says done, in several visits pooled, like the sweep)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from analysis.harness_exec import Program, Runner
from analysis.layers import Layer
from analysis.sbp import P, local_slices
from microbench import provenance
from microbench.stats import Estimate, StopRule, pooled_estimate, round_spread, sample_until_done

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
    rounds: int = 1
    round_spread: float = 0.0
    cpu_steal: float | None = None


def layer_data(layer: Layer, seed: int, dtype: str) -> dict:
    """Seeded global inputs, weights and output gradients of one layer, in `dtype`."""
    rng = np.random.default_rng(seed)
    out: dict = {name: rng.standard_normal(shape).astype(dtype) for name, shape in layer.data_shapes().items()}
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


class Bench:
    """One strategy's program on this rank: checked once, then sampled in visits (passes over the layer's
    strategies, as the sweep does over its points) whose rows of per-item seconds (max over ranks) are pooled."""

    def __init__(self, runner: Runner, prog: Program) -> None:
        self.runner, self.prog = runner, prog
        self.visits: list[np.ndarray] = []
        self.max_rel_err = np.inf
        self.sent_bytes = 0
        self.cpu_ticks: np.ndarray | None = np.zeros(8, dtype=np.int64)   # None: this host cannot tell

    def _once(self) -> tuple[dict, np.ndarray]:
        coll, env = self.runner.coll, dict(self.prog.inputs)
        out = np.empty(len(self.prog.items))
        for i, it in enumerate(self.prog.items):
            coll.barrier()
            t0 = time.perf_counter()
            it.run(env)
            coll.sync()
            out[i] = time.perf_counter() - t0
        return env, out

    def _batch(self, iters: int) -> tuple[np.ndarray, float]:
        t0 = time.perf_counter()
        rows = np.stack([self._once()[1] for _ in range(iters)])
        wall = np.full((1, len(self.prog.items)), time.perf_counter() - t0)
        got = self.runner.coll.world_max(np.concatenate([rows, wall]))
        return got[:-1], float(got[-1, 0])

    def check(self, dtype: str, what: str) -> None:
        """Run once (untimed) and compare every output with the reference: NumericsError past TOLERANCE. Records
        `sent_bytes`, the most bytes any rank handed to collectives in that run."""
        before = self.runner.coll.sent
        env, _ = self._once()
        self.sent_bytes = int(self.runner.coll.world_max(np.array([float(self.runner.coll.sent - before)]))[0])
        errs = self.runner.coll.world_max(rel_errors(self.runner, self.prog, env))
        bad = [(o.name, e) for o, e in zip(self.prog.outputs, errs) if not e <= TOLERANCE[dtype]]
        if bad:
            raise NumericsError(f"{what}: " + ", ".join(f"{n} max relative error {e:.3g}" for n, e in bad)
                                + f" > {TOLERANCE[dtype]:g} against the single-process reference")
        self.max_rel_err = float(errs.max(initial=0.0))

    def visit(self, rule: StopRule) -> None:
        """Warm up, then time batches of iterations until the rule (this visit's share of the budget) is met;
        this host's CPU time counters are read around it, for the steal during the strategy's visits."""
        before = provenance.cpu_counters()
        _, per_iter = self._batch(1)
        self.visits.append(sample_until_done(self._batch, rule, per_iter, lambda rows: rows.sum(axis=1)))
        after = provenance.cpu_counters()
        if before is None or after is None or self.cpu_ticks is None:
            self.cpu_ticks = None
        else:
            self.cpu_ticks += np.subtract(after, before)

    def timed(self, rule: StopRule) -> Timed:
        """The pooled visits: totals, communication and compute, each item's median, the target, the spread and
        this host's CPU steal over the visits."""
        comm = np.array([it.is_comm for it in self.prog.items], dtype=bool)

        def pooled(cols: np.ndarray) -> Estimate:
            """The pooled estimate of the sum of these items' columns, every visit weighing the same."""
            return pooled_estimate([v[:, cols].sum(axis=1) for v in self.visits])

        est = pooled(np.ones_like(comm))
        items = tuple(pooled(np.arange(len(comm)) == i).median for i in range(len(comm)))
        spread = round_spread([v.sum(axis=1) for v in self.visits], est.median)
        steal = None if self.cpu_ticks is None else provenance.steal_share(self.cpu_ticks)
        return Timed(est, pooled(comm), pooled(~comm), items, rule.met(est), self.max_rel_err, len(self.visits),
                     spread, steal)
