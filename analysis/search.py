"""Strategy search over a model's chain of layers on a mesh, priced by a Pricer.

Every layer's strategies are enumerated and priced (exhaustive per layer); between neighbours the
activation is redistributed forward (y of one -> x of the next) and its gradient backward (dx of the next
-> dy of the one), and the last layer's output is resolved (P -> B) with its gradient arriving that way.
The chain optimum is exact by dynamic programming over layers. A memory cap (bytes per device, summed over
layers) is met by Lagrangian relaxation: minimise time + lambda * memory, bisecting lambda. AutoDDL's
coordinate descent (each layer in turn set to its best given its neighbours, from random starts) runs on
the same tables for comparison."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from analysis import strategies as tp
from analysis.layers import Layer, Schedule, Strategy
from analysis.mesh import Mesh
from analysis.models import Model
from analysis.pricing import Pricer, resolve
from analysis.redistribute import Plan, adjoint, dual, plan
from analysis.sbp import B, P, Signature
from analysis.strategies import Selection
from microbench.errors import UsageError


def round_trip(shape, itemsize, src: Signature, dst: Signature, grad_src: Signature, grad_dst: Signature,
               permutable: frozenset[int], mesh: Mesh) -> tuple[Plan, Plan]:
    """An activation's plan between layers and its gradient's. Where the gradient signatures are the duals of
    the forward ones, the forward may permute dims in `permutable` and the gradient then takes the forward's
    adjoint, which restores the order; elsewhere both are plain plans."""
    perm = permutable if permutable and grad_src == dual(dst) and grad_dst == dual(src) else frozenset()
    forward = plan(shape, itemsize, src, dst, mesh, perm)
    if forward.permuted:
        return forward, adjoint(forward, mesh)
    return forward, plan(shape, itemsize, grad_src, grad_dst, mesh)


def resolved(sig: Signature) -> Signature:
    """The model output's signature: partial sums reduced (P -> B)."""
    return tuple(B if p == P else p for p in sig)


@dataclass
class LayerOptions:
    """One layer's strategies, their schedules and prices (inf where infeasible)."""

    layer: Layer
    need_dx: bool
    strategies: list[Strategy]
    schedules: list[Schedule]
    comm_s: np.ndarray
    compute_s: np.ndarray
    memory: np.ndarray

    @property
    def time_s(self) -> np.ndarray:
        return self.comm_s + self.compute_s


MAX_PAIRS = 1 << 21
"""The most strategy pairs between adjacent layers one search plans a redistribution for (each 20-100 us, and kept in
memory): a few minutes at most. Each mesh axis multiplies a layer's strategies by 4 or 5, so a transformer's five
axes hold about ten times as many."""


@dataclass
class Tables:
    """Everything the chain search needs: per-layer options, transition matrices and the end boundary."""

    model: Model
    mesh: Mesh
    options: list[LayerOptions]
    transitions: list[np.ndarray]       # [i]: (S_i, S_{i+1}) seconds between layer i and i+1
    final: np.ndarray                   # (S_last,) seconds to resolve the output and its gradient


class Tabulator:
    """Builds Tables, caching schedules by layer shape and plan prices by (tensor, src, dst). `selection` picks the
    strategies priced (analysis.strategies); None: every SBP strategy and every Colossal-AI one whose collectives the
    calibration has models for on some link class (the others go to `left_out`: id -> why), not their SBP
    equivalents (the chain prices the SBP strategies with their redistributions already)."""

    def __init__(self, pricer: Pricer, selection: Selection | None = None):
        self.pricer = pricer
        self.selection = selection
        self.left_out: dict[str, str] = {}
        self._layers: dict = {}
        self._plans: dict = {}
        self._trans: dict = {}

    def options(self, layer: Layer, need_dx: bool) -> LayerOptions:
        key = (replace(layer, name=""), need_dx)
        if key not in self._layers:
            mesh = self.pricer.mesh
            strategies, schedules = [], []
            for s in tp.strategies(layer, mesh):
                sc = tp.schedule(layer, s, mesh, need_dx)
                if self._wanted(sc):
                    strategies.append(s)
                    schedules.append(sc)
            comm, comp = self.pricer.price([sc.steps for sc in schedules])
            bad = np.array([not sc.feasible for sc in schedules], dtype=bool)
            comm[bad] = np.inf
            comp[bad] = np.inf
            mem = np.array([sc.memory_bytes for sc in schedules], dtype=float)
            self._layers[key] = LayerOptions(layer, need_dx, strategies, schedules, comm, comp, mem)
        opt = self._layers[key]
        return opt if opt.layer is layer else replace(opt, layer=layer)

    def _wanted(self, sc: Schedule) -> bool:
        if self.selection is not None:
            return self.selection.picks(sc.strategy)
        fam = tp.family(sc.strategy)
        if fam != "cai":
            return fam == "sbp"
        cal, axes = self.pricer.cal, self.pricer.mesh.axes
        lacking = sorted({st.op for st in sc.steps if st.is_comm and resolve(cal, st.op, axes[st.axis].link) is None})
        if lacking:
            self.left_out[sc.strategy.id] = f"the calibration has no {', '.join(lacking)} model on any link class"
        return not lacking

    def _price(self, plans: dict) -> None:
        """Seconds of every new plan in `plans` (key -> Plan), into the cache (inf where infeasible)."""
        todo = [(k, p) for k, p in plans.items() if k not in self._plans]
        comm, _ = self.pricer.price([p.steps for _, p in todo])
        for (k, p), c in zip(todo, comm):
            self._plans[k] = c if p.feasible else np.inf

    def plan_seconds(self, shape, itemsize, pairs: list[tuple[Signature, Signature]]) -> np.ndarray:
        """Seconds of each (src, dst) redistribution of a `shape` tensor (inf where infeasible)."""
        mesh = self.pricer.mesh
        self._price({(shape, itemsize, s, d): plan(shape, itemsize, s, d, mesh) for s, d in set(pairs)
                     if (shape, itemsize, s, d) not in self._plans})
        return np.array([self._plans[(shape, itemsize, s, d)] for s, d in pairs])

    def round_trip_seconds(self, shape, itemsize, fwd: list[tuple[Signature, Signature]],
                           bwd: list[tuple[Signature, Signature]], permutable: frozenset[int]) -> np.ndarray:
        """Seconds of each forward redistribution plus its gradient's (see round_trip)."""
        new: dict = {}
        keys = []
        for (s, d), (gs, gd) in zip(fwd, bwd):
            key = (shape, itemsize, s, d, gs, gd, permutable)
            if key not in self._plans and key not in new:
                f, b = round_trip(shape, itemsize, s, d, gs, gd, permutable, self.pricer.mesh)
                new[key] = Plan(shape, itemsize, s, gd, f.steps + b.steps, f.feasible and b.feasible)
            keys.append(key)
        self._price(new)
        return np.array([self._plans[k] for k in keys])

    @staticmethod
    def _transition_key(a: LayerOptions, b: LayerOptions) -> tuple:
        """Transitions between layers of the same shapes are planned once."""
        return replace(a.layer, name=""), a.need_dx, replace(b.layer, name=""), b.need_dx

    def transition(self, a: LayerOptions, b: LayerOptions) -> np.ndarray:
        key = self._transition_key(a, b)
        if key not in self._trans:
            ya = [tp.sigs(a.layer, s) for s in a.strategies]
            xb = [tp.sigs(b.layer, s) for s in b.strategies]
            shape, isz = a.layer.out_shape, a.layer.itemsize
            fwd = [(ga.y, gb.x) for ga in ya for gb in xb]
            bwd = [(gb.dx, ga.dy) for ga in ya for gb in xb]
            t = self.round_trip_seconds(shape, isz, fwd, bwd, b.layer.PERMUTABLE_INPUT)
            self._trans[key] = t.reshape(len(ya), len(xb))
        return self._trans[key]

    def final(self, a: LayerOptions) -> np.ndarray:
        gs = [tp.sigs(a.layer, s) for s in a.strategies]
        shape, isz = a.layer.out_shape, a.layer.itemsize
        return (self.plan_seconds(shape, isz, [(g.y, resolved(g.y)) for g in gs])
                + self.plan_seconds(shape, isz, [(resolved(g.y), g.dy) for g in gs]))

    def tables(self, model: Model) -> Tables:
        options = [self.options(layer, i > 0) for i, layer in enumerate(model.layers)]
        pairs = sum({self._transition_key(a, b): len(a.strategies) * len(b.strategies)
                     for a, b in zip(options, options[1:])}.values())
        if pairs > MAX_PAIRS:
            raise UsageError(f"{model.name} on mesh {'x'.join(map(str, self.pricer.mesh.shape))} has {pairs} strategy "
                             f"pairs between adjacent layers to plan, more than {MAX_PAIRS} (minutes and gigabytes): "
                             f"search a mesh of fewer axes")
        transitions = [self.transition(a, b) for a, b in zip(options, options[1:])]
        return Tables(model, self.pricer.mesh, options, transitions, self.final(options[-1]))


def chain_cost(t: Tables, choice: np.ndarray, lam: float = 0.0) -> float:
    """Total seconds (+ lam * memory) of one assignment (strategy index per layer)."""
    total = sum(o.time_s[c] + lam * o.memory[c] for o, c in zip(t.options, choice))
    total += sum(m[a, b] for m, a, b in zip(t.transitions, choice, choice[1:]))
    return float(total + t.final[choice[-1]])


def evaluate_many(t: Tables, choices: np.ndarray) -> np.ndarray:
    """Total seconds of many assignments at once: choices is (N, layers) of strategy indices."""
    total = t.final[choices[:, -1]].copy()
    for i, o in enumerate(t.options):
        total += o.time_s[choices[:, i]]
    for i, m in enumerate(t.transitions):
        total += m[choices[:, i], choices[:, i + 1]]
    return total


def node_costs(t: Tables, lam: float) -> list[np.ndarray]:
    """Each layer's per-strategy seconds + lam * memory (inf where infeasible)."""
    return [np.where(np.isfinite(o.time_s), o.time_s + lam * np.where(np.isfinite(o.memory), o.memory, 0), np.inf)
            for o in t.options]


def _viterbi(nodes: list[np.ndarray], transitions: list[np.ndarray], enter: np.ndarray, leave: np.ndarray):
    """Cheapest path through layers with node costs, transition matrices, and costs to enter and leave."""
    best = enter + nodes[0]
    back = []
    for m, node in zip(transitions, nodes[1:]):
        total = best[:, None] + m
        arg = np.argmin(total, axis=0)
        back.append(arg)
        best = total[arg, np.arange(total.shape[1])] + node
    best = best + leave
    choice = [int(np.argmin(best))]
    value = float(best[choice[0]])
    for arg in reversed(back):
        choice.append(int(arg[choice[-1]]))
    return np.array(choice[::-1]), value


def dp(t: Tables, lam: float = 0.0) -> tuple[np.ndarray, float]:
    """The exact optimum of time + lam * memory over the chain (Viterbi over layers)."""
    nodes = node_costs(t, lam)
    return _viterbi(nodes, t.transitions, np.zeros_like(nodes[0]), t.final)


def memory_of(t: Tables, choice: np.ndarray) -> float:
    return float(sum(o.memory[c] for o, c in zip(t.options, choice)))


def optimum(t: Tables, cap: float | None = None) -> tuple[np.ndarray | None, float]:
    """(assignment, lambda): the fastest assignment whose memory fits `cap`, exact where the cap does not bind
    (lambda 0); where it binds, the fastest at the smallest lambda whose Lagrangian optimum fits, which cap_bound
    bounds; (None, lam) if none fits."""
    choice, _ = dp(t)
    if cap is None or memory_of(t, choice) <= cap:
        return choice, 0.0
    lo, hi = 0.0, 1e-9
    while memory_of(t, dp(t, hi)[0]) > cap:
        hi *= 16
        if hi > 1e6:
            return None, hi
    for _ in range(40):
        mid = (lo + hi) / 2
        if memory_of(t, dp(t, mid)[0]) > cap:
            lo = mid
        else:
            hi = mid
    return dp(t, hi)[0], hi


def cap_bound(t: Tables, lam: float, cap: float) -> float:
    """Seconds no assignment within `cap` bytes per device beats (Lagrangian duality: for lam >= 0 the cheapest
    time + lam * memory, less lam * cap): how far a capped optimum() may be from the best, where the cap binds."""
    return dp(t, lam)[1] - lam * cap


def coordinate_descent(t: Tables, restarts: int = 8, seed: int = 0, lam: float = 0.0,
                       window: int = 1) -> np.ndarray:
    """AutoDDL-style coordinate descent: from the per-layer best and from random starts, set each layer
    (window > 1: each run of `window` consecutive layers, exactly) to its best given its neighbours, until
    a sweep changes nothing; the best local optimum found."""
    rng = np.random.default_rng(seed)
    nodes = node_costs(t, lam)
    n = len(nodes)
    w = max(1, min(window, n))
    starts = [np.array([int(np.argmin(c)) for c in nodes])]
    for _ in range(restarts):
        starts.append(np.array([rng.choice(np.flatnonzero(np.isfinite(c))) for c in nodes]))
    best, best_cost = None, math.inf
    for choice in starts:
        improved = True
        while improved:
            improved = False
            for i in range(n - w + 1):
                enter = t.transitions[i - 1][choice[i - 1], :] if i > 0 else np.zeros_like(nodes[i])
                leave = t.transitions[i + w - 1][:, choice[i + w]] if i + w < n else t.final
                part, value = _viterbi(nodes[i:i + w], t.transitions[i:i + w - 1], enter, leave)
                now = choice[i:i + w]
                current = (enter[now[0]] + sum(c[k] for c, k in zip(nodes[i:i + w], now)) + leave[now[-1]]
                           + sum(m[a, b] for m, a, b in zip(t.transitions[i:i + w - 1], now, now[1:])))
                if value < current * (1 - 1e-12):
                    choice[i:i + w] = part
                    improved = True
        cost = chain_cost(t, choice, lam)
        if best is None or cost < best_cost:
            best, best_cost = choice, cost
    return best
