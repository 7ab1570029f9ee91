"""ParaDL's strategies for a whole network (Kahira et al., "An Oracle for Guiding Large-Scale Model/Hybrid Parallel
Training of Convolutional Neural Networks", HPDC 2021): each is one role per mesh axis, and each role one choice per
layer kind (ROLES), so a strategy is an assignment of the layers' SBP strategies; it is priced as the chain it runs
(every layer's schedule and the redistributions between layers, analysis.summary.chain_steps) by analysis.pricing.

  data          batch split everywhere: the weight gradients are allreduced.
  filter        output channels (and a dense layer's output neurons) split: each layer's output is allgathered for the
                next, and its input gradient, a partial sum, reduce-scattered.
  channel       input channels (input neurons) split: each output is a partial sum, reduce-scattered for the next.
  spatial       H split with halo exchanges (analysis.halo); the dense head goes batch-parallel (an all-to-all).
  data+filter   on a 2-d mesh, data across axis 0 and filter along axis 1; data+spatial likewise.
  pipeline      the layers cut into p contiguous stages of equal time, m micro-batches through them under a schedule
                of analysis.schedules (bubble and point-to-point messages as training.py prices them); validate runs
                it on analysis.harness_pipeline's executor (analysis.validate_pipeline).

Pure strategies name the same role on every axis; spatial runs on one axis only (the halo's), so on a 1-d mesh."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.conv import Activation2d, BatchNorm2d, Conv2d, Flatten, Pool2d
from analysis.layers import Elementwise, Layer, Linear, Strategy
from analysis.mesh import Mesh
from analysis.models import Model, parse_model
from analysis.pricing import Pricer
from analysis.schedules import Schedule, balanced_stages
from analysis.search import Tables, Tabulator
from analysis.summary import chain_steps
from microbench.errors import UsageError

PUBLISHED = {"data": 0.9610, "filter": 0.8556, "channel": 0.7367, "data+filter": 0.9143, "data+spatial": 0.8346,
             "pipeline": 0.9022}
"""ParaDL's published mean accuracy per strategy (mean 0.8674), 1 - |predicted - measured| / measured."""

ROLES = {Conv2d: {"d": "n", "f": "f", "c": "c", "s": "s"},
         Activation2d: {"d": "n", "f": "c", "c": "c", "s": "s"},
         BatchNorm2d: {"d": "n", "f": "c", "c": "c", "s": "s"},
         Pool2d: {"d": "n", "f": "c", "c": "c", "s": "s"},
         Flatten: {"d": "n", "f": "c", "c": "c", "s": "n"},
         Linear: {"d": "m", "f": "n", "c": "k", "s": "m"},
         Elementwise: {"d": "r", "f": "c", "c": "c", "s": "r"}}
"""Each layer kind's choice for a mesh axis's role: d data, f filter, c channel, s spatial."""

STRATEGIES = {"data": {1: "d", 2: "dd"}, "filter": {1: "f", 2: "ff"}, "channel": {1: "c", 2: "cc"},
              "spatial": {1: "s"}, "data+filter": {2: "df"}, "data+spatial": {2: "ds"}}
"""The roles of each network strategy per mesh dimensionality (absent: it does not apply)."""


def applicable(mesh: Mesh) -> list[str]:
    """The ParaDL strategies that run on this mesh's number of axes."""
    return [name for name, by in STRATEGIES.items() if len(mesh.shape) in by]


def assignment(model: Model, name: str, mesh: Mesh) -> list[Strategy]:
    """Each layer's SBP strategy under network strategy `name`."""
    roles = STRATEGIES[name].get(len(mesh.shape))
    if roles is None:
        raise UsageError(f"strategy {name!r} needs a {' or '.join(f'{n}-d' for n in STRATEGIES[name])} mesh, "
                         f"not {'x'.join(map(str, mesh.shape))}")
    out = []
    for layer in model.layers:
        table = ROLES.get(type(layer))
        if table is None:
            raise UsageError(f"layer {layer.name} ({type(layer).__name__}) has no ParaDL strategy")
        out.append(Strategy(tuple(table[r] for r in roles)))
    return out


@dataclass
class NetworkOptions:
    """A network's strategies on a mesh, each an assignment of its layers' strategies, priced end to end: what
    validate reads of a layer's LayerOptions (strategies, time_s, comm_s, compute_s), plus the chain's tables and
    each strategy's choice of layer strategies (indices into the tables' options)."""

    model: Model
    tables: Tables
    strategies: list[Strategy]
    choices: list[np.ndarray]
    comm_s: np.ndarray
    compute_s: np.ndarray

    @property
    def time_s(self) -> np.ndarray:
        return self.comm_s + self.compute_s

    def steps(self, i: int) -> list:
        """Strategy i's schedule entries in execution order."""
        return [st for _, steps in chain_steps(self.tables, self.choices[i], permute=False) for st in steps]


def network_options(model: Model, names: list[str], tab: Tabulator) -> NetworkOptions:
    """The network strategies `names` priced on the tabulator's mesh; one that cannot run there is bad input."""
    mesh = tab.pricer.mesh
    tables = tab.tables(model)
    choices = []
    for name in names:
        picks = []
        for o, st in zip(tables.options, assignment(model, name, mesh)):
            i = o.strategies.index(st)
            if not o.schedules[i].feasible:
                raise UsageError(f"strategy {name} cannot run layer {o.layer.name} on mesh "
                                 f"{'x'.join(map(str, mesh.shape))}: {o.schedules[i].reason}")
            picks.append(i)
        choices.append(np.array(picks))
    opts = NetworkOptions(model, tables, [Strategy((n,)) for n in names], choices, np.zeros(len(names)),
                          np.zeros(len(names)))
    opts.comm_s, opts.compute_s = tab.pricer.price([opts.steps(i) for i in range(len(names))])
    return opts


@dataclass(frozen=True)
class Pipeline:
    """A pipeline's predicted step: stages (layer counts), the slowest stage's and the mean stage's time per
    micro-batch (forward and backward), the bubble, the point-to-point messages and the total."""

    stages: tuple[int, ...]
    micro_batches: int
    slowest_s: float
    bubble_s: float
    messages_s: float
    total_s: float


def micro_batch_model(spec: str, micro_batches: int, dtype: str = "float32") -> Model:
    """Model `spec` at the batch of one of `micro_batches` micro-batches: what each pipeline stage runs per pass."""
    batch = parse_model(spec, dtype).layers[0].in_shape[0]
    if micro_batches < 1 or batch % micro_batches:
        raise UsageError(f"pipeline: the batch of {batch} does not split into {micro_batches} micro-batches")
    return parse_model(spec + ("," if ":" in spec else ":") + f"batch={batch // micro_batches}", dtype)


def pipeline(spec: str, calibration, mesh: Mesh, micro_batches: int, schedule: Schedule, dtype: str = "float32",
             nics_per_node: int = 1, profile=None) -> Pipeline:
    """ParaDL's pipeline strategy for model `spec` over all the mesh's devices as stages, in order (one stage per
    device, the mesh flattened): each layer replicated on its stage at the micro-batch size (its kernels priced by
    `profile` where it has them), stages balanced by time, and the step as analysis.training prices a pipeline: m
    times the slowest stage, the schedule's bubble in mean stages, and its critical-path messages, each the largest
    stage boundary's activation as a pingpong on the link between stages."""
    stages = Mesh((mesh.devices,), mesh.ranks_per_node)
    model = micro_batch_model(spec, micro_batches, dtype)
    p = stages.devices
    if p > len(model.layers):
        raise UsageError(f"pipeline: {len(model.layers)} layers do not make {p} stages")
    one = Tabulator(Pricer(calibration, Mesh((1,), 1), dtype, nics_per_node, profile))
    times = [float(one.options(layer, i > 0).time_s[0]) for i, layer in enumerate(model.layers)]
    cut = balanced_stages(times, p)
    ends = np.cumsum(cut)
    per_stage = [sum(times[e - c:e]) for c, e in zip(cut, ends)]
    pricer = Pricer(calibration, stages, dtype, nics_per_node)
    boundary = max((_bytes(model.layers[e - 1]) for e in ends[:-1]), default=0)
    message = float(pricer.seconds("pingpong", 0, [boundary])[0]) if p > 1 else 0.0
    m = micro_batches
    bubble = schedule.bubble_slots(p) * float(np.mean(per_stage))
    messages = schedule.messages(p, m) * message
    slowest = max(per_stage)
    return Pipeline(cut, m, slowest, bubble, messages, m * slowest + bubble + messages)


def _bytes(layer: Layer) -> int:
    return int(np.prod(layer.out_shape)) * layer.itemsize


PIPELINE = "pipeline"
PIPELINE_MICRO_BATCHES = 4
PIPELINE_SCHEDULE = Schedule("gpipe")
"""The pipeline that network_table prices: GPipe (ParaDL's pipeline model) with 4 micro-batches."""


def network_table(spec: str, model: Model, tab: Tabulator, calibration, dtype: str = "float32",
                  nics_per_node: int = 1) -> list[dict]:
    """Every ParaDL strategy's predicted step on the tabulator's mesh, as rows (strategy, total_s, comm_s,
    compute_s, or why it cannot run), the pipeline last."""
    rows = []
    for name in applicable(tab.pricer.mesh):
        try:
            opts = network_options(model, [name], tab)
        except UsageError as exc:
            rows.append({"strategy": name, "total_s": None, "reason": str(exc)})
            continue
        rows.append({"strategy": name, "total_s": float(opts.time_s[0]), "comm_s": float(opts.comm_s[0]),
                     "compute_s": float(opts.compute_s[0])})
    try:
        pipe = pipeline(spec, calibration, tab.pricer.mesh, PIPELINE_MICRO_BATCHES, PIPELINE_SCHEDULE, dtype,
                        nics_per_node, tab.pricer.profile)
        rows.append({"strategy": PIPELINE, "total_s": pipe.total_s, "comm_s": pipe.messages_s,
                     "compute_s": pipe.total_s - pipe.messages_s, "stages": list(pipe.stages),
                     "micro_batches": pipe.micro_batches, "schedule": str(PIPELINE_SCHEDULE)})
    except UsageError as exc:
        rows.append({"strategy": PIPELINE, "total_s": None, "reason": str(exc)})
    return rows
