"""A training step of a chain of layers from analysis.models (dense, mlp, linear, cnn, embedding: the models that
are not transformers) under a parallel configuration, assembled as the transformer's is (analysis.training's
StepPricer: pipeline messages and bubble, data-parallel and ZeRO collectives, optimizer, memory by ZeRO stage).
Pure. docs/training.md, "Chain models", derives each part; in short:

- Tensor size t: the chain's fastest assignment of SBP strategies (analysis.search, exact by dynamic programming)
  on a tensor group of t devices at the micro-batch size, each layer's forward and backward priced with the
  redistributions around it.
- Pipeline size p (v virtual stages each): the chain cut into p v contiguous chunks whose slowest is fastest, chunk
  k on device k mod p; a message is the largest chunk boundary's activation, 1/t of it per device, all-gathered by
  the receiving group.
- Recomputation: full only (the forward again; a chunk keeps only its input). Selective recomputation and sequence
  parallelism are a transformer's and refused.
- Memory: weights per device as each layer's strategy stores them; activations the input each layer keeps for its
  backward (its local share), times the schedule's in-flight micro-batches."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from analysis.layers import Layer, Strategy
from analysis.mesh import Mesh
from analysis.models import Model, parse_model, parse_spec
from analysis.pricing import Pricer
from analysis.sbp import local_shape
from analysis.schedules import balanced_stages
from analysis.search import Tabulator, optimum
from analysis.strategies import Selection
from analysis.summary import chain_steps
from analysis.training import (RECOMPUTE, Config, LayerTimes, StageTimes, StepPricer, configurations, divisors,
                               pipeline_schedules)
from microbench.errors import UsageError

BATCH_KEY = {"linear": "m", "mlp": "batch", "dense": "batch", "cnn": "batch", "embedding": "tokens"}
"""Each chain kind's parameter holding the global batch (rows, samples or tokens), which a micro-batch replaces."""
SBP = Selection(frozenset({"sbp"}))
"""A tensor group's strategies: the SBP ones (the layer search's Colossal-AI strategies need a grid of axes)."""


def _elements(layer: Layer, name: str, strategy: Strategy | None, t: int) -> int:
    """Elements of the layer's data `name` (X, W) on one of t devices under `strategy` (None: whole); 0 if none."""
    shape = layer.data_shapes().get(name)
    if shape is None:
        return 0
    return math.prod(shape if strategy is None else local_shape(shape, layer.data_sigs(strategy)[name], (t,)))


@dataclass(frozen=True)
class Chain:
    """A chain model by its spec: its kind, global batch, parameters and layer count."""

    name: str
    kind: str
    batch: int
    params: int
    layers: int

    @classmethod
    def parse(cls, spec: str, dtype: str) -> "Chain":
        kind, p = parse_spec(spec)
        if kind not in BATCH_KEY:
            raise UsageError(f"{spec!r} is a {kind}, not a chain of layers")
        model = parse_model(spec, dtype)
        return cls(spec, kind, p[BATCH_KEY[kind]], sum(_elements(x, "W", None, 1) for x in model.layers),
                   len(model.layers))

    def at(self, micro_batch: int, dtype: str) -> Model:
        """The model with its batch replaced by one micro-batch."""
        return parse_model(f"{self.name}{',' if ':' in self.name else ':'}{BATCH_KEY[self.kind]}={micro_batch}", dtype)


@dataclass(frozen=True)
class LayerCost:
    """One layer on one tensor group for one micro-batch under its chosen strategy: the seconds of its forward and
    backward (compute, and as tensor-parallel communication its strategy's and the redistributions into its successor
    and of its gradient back), the elements of its weights stored per device, the bytes of the input it keeps per device
    and of its whole output."""

    times: LayerTimes
    weights: int
    kept_bytes: int
    out_bytes: int


@dataclass(frozen=True)
class Cut:
    """Where a configuration cuts the chain: each device's layers (indices, chunk by chunk) and its stage times."""

    devices: tuple[tuple[tuple[int, ...], ...], ...]
    times: StageTimes


class ChainTrainingPricer(StepPricer):
    """Prices configurations of a chain model, caching each (t, micro-batch)'s layer costs and each cut."""

    def __init__(self, calibration, model: Chain, devices: int, gpus_per_node: int, dtype: str,
                 nics_per_node: int = 1, memory_bytes: float | None = None, mixed: bool = True):
        super().__init__(calibration, model, devices, gpus_per_node, dtype, nics_per_node, memory_bytes, mixed=mixed)
        self._costs: dict[tuple[int, int], list[LayerCost] | str] = {}
        self._cuts: dict[tuple, Cut] = {}

    def group(self, t: int) -> Pricer:
        """The pricer of one tensor group: t devices, a node's worth or whole nodes of them (the mesh's last axis)."""
        key = (t,)
        if key not in self._pricers:
            self._pricers[key] = Pricer(self.cal, Mesh((t,), min(t, self.gpus_per_node)), self.dtype,
                                        self.nics_per_node)
        return self._pricers[key]

    def layer_costs(self, t: int, micro_batch: int) -> list[LayerCost] | str:
        """Every layer's cost under the chain's fastest strategies on a tensor group of t, or why none runs there."""
        key = (t, micro_batch)
        if key not in self._costs:
            self._costs[key] = self._price_chain(t, micro_batch)
        return self._costs[key]

    def _price_chain(self, t: int, micro_batch: int) -> list[LayerCost] | str:
        model = self.model.at(micro_batch, self.dtype)
        pricer = self.group(t)
        tables = Tabulator(pricer, SBP).tables(model)
        for o in tables.options:
            if not any(math.isfinite(x) for x in o.time_s):
                return f"no strategy of layer {o.layer.name} runs on a tensor group of {t}: {o.schedules[0].reason}"
        choice, _ = optimum(tables)
        groups = chain_steps(tables, choice)          # per layer: forward and its way out; at the end, backward
        comm, comp = pricer.price([steps for _, steps in groups])
        n = len(model.layers)
        out = []
        for i, (o, c) in enumerate(zip(tables.options, choice)):
            f, b = [2 * i, 2 * i + 1], [2 * (2 * n - 1 - i), 2 * (2 * n - 1 - i) + 1]
            s, layer = o.strategies[c], o.layer
            times = LayerTimes(float(comp[f].sum()), float(comp[b].sum()), 0.0, float(comm[f].sum()),
                               float(comm[b].sum()), 0.0)
            out.append(LayerCost(times, _elements(layer, "W", s, t),
                                 _elements(layer, "X", s, t) * layer.itemsize,
                                 math.prod(layer.out_shape) * layer.itemsize))
        return out

    def cut(self, c: Config) -> Cut:
        """The configuration's chunks (p v of them, balanced by time, chunk k on device k mod p) and stage times."""
        key = (c.t, c.p, c.micro_batch, c.schedule.v, c.recompute)
        if key not in self._cuts:
            self._cuts[key] = self._cut(c, self.layer_costs(c.t, c.micro_batch))
        return self._cuts[key]

    def _cut(self, c: Config, costs: list[LayerCost]) -> Cut:
        full = c.recompute == "full"
        times = [x.times.total + (x.times.fwd + x.times.tp_fwd if full else 0.0) for x in costs]
        chunks, start = [], 0
        for count in balanced_stages(times, c.p * c.schedule.v):
            chunks.append(tuple(range(start, start + count)))
            start += count
        devices = tuple(tuple(chunks[k] for k in range(r, len(chunks), c.p)) for r in range(c.p))
        per = [self._device([costs[i] for chunk in dev for i in chunk], full) for dev in devices]
        slow = max(per, key=lambda st: st.slowest)
        boundary = max((costs[chunk[-1]].out_bytes for chunk in chunks[:-1]), default=0)
        return Cut(devices, replace(slow, mean=sum(st.slowest for st in per) / c.p, message_bytes=boundary / c.t,
                                    params=max(st.params for st in per), layers=max(st.layers for st in per)))

    @staticmethod
    def _device(mine: list[LayerCost], full: bool) -> StageTimes:
        """One device's layers per micro-batch (full recomputation: their forward again, compute and communication);
        the data-parallel windows are the passes' compute, as the transformer's."""
        t = [x.times for x in mine]
        fwd, tp_fwd = sum(x.fwd for x in t), sum(x.tp_fwd for x in t)
        tp = sum(x.tp for x in t) + (tp_fwd if full else 0.0)
        return StageTimes(sum(x.compute for x in t), fwd if full else 0.0, tp, 0.0, fwd, sum(x.bwd for x in t), 0.0,
                          sum(x.weights for x in mine), len(mine))

    def stage_params(self, c: Config) -> float:
        return self.cut(c).times.params

    def activations(self, c: Config, m: int) -> float:
        """The device holding most: each layer's kept input (full recomputation: each chunk's first only, plus the
        largest chunk's while it is recomputed), times the schedule's in-flight micro-batches."""
        costs = self.layer_costs(c.t, c.micro_batch)
        held = c.schedule.in_flight(c.p, m)
        worst = 0.0
        for dev in self.cut(c).devices:
            if c.recompute == "full":
                acts = held * sum(costs[ch[0]].kept_bytes for ch in dev) + max(
                    sum(costs[i].kept_bytes for i in ch) for ch in dev)
            else:
                acts = held * sum(costs[i].kept_bytes for ch in dev for i in ch)
            worst = max(worst, acts)
        return worst

    def _stage_times(self, c: Config) -> StageTimes:
        return self.cut(c).times

    def problem(self, c: Config) -> str | None:
        """Why configuration c cannot run this chain on these devices (before memory), or None."""
        model, g = self.model, self.gpus_per_node
        if c.t * c.p * c.d != self.devices:
            return f"t x p x d = {c.t * c.p * c.d}, not the {self.devices} devices"
        if g % c.t and c.t % g:
            return f"t={c.t} neither divides the {g} devices per node nor fills whole nodes"
        if model.batch % (c.d * c.micro_batch):
            return f"the global batch of {model.batch} does not split into d={c.d} x micro-batches of {c.micro_batch}"
        if c.sp:
            return f"sequence parallelism splits a transformer's norm and dropout regions; a {model.kind} has none"
        if c.recompute == "selective":
            return f"selective recomputation repeats a transformer's attention core; a {model.kind} has none"
        if c.zero and c.d == 1:
            return "ZeRO shards across data parallelism: it needs d > 1"
        why = c.schedule.problem(c.p, self.micro_batches(c), model.layers, equal=False)
        if why:
            return why
        costs = self.layer_costs(c.t, c.micro_batch)
        return costs if isinstance(costs, str) else None

    def space(self, max_micro_batch: int = 8, max_v: int = 8):
        """Every configuration worth pricing: t a divisor or multiple of the devices per node, p up to the layer
        count, d the rest; micro-batches dividing the per-replica batch (up to max_micro_batch); GPipe, 1F1B and
        interleaved with p v chunks of a layer or more; ZeRO 0-3 and overlap where d > 1; no or full recomputation."""
        model, g, n = self.model, self.gpus_per_node, self.devices
        shapes = ((t, p, pipeline_schedules(p, (v for v in range(2, max_v + 1) if p * v <= model.layers)))
                  for t in divisors(n) if not (g % t and t % g)
                  for p in divisors(n // t) if p <= model.layers)
        recomputes = [r for r in RECOMPUTE if r != "selective"]
        return configurations(n, model.batch, shapes, max_micro_batch, False, recomputes)
