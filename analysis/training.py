"""A training step under a parallel configuration (tensor t, pipeline p with a schedule, data d with a ZeRO stage,
micro-batch size and count, sequence parallelism, recomputation, data-parallel overlap), timed and sized per device
from a calibration: what every model kind shares (StepPricer: the step's assembly) and a transformer's own pricing
(TrainingPricer; chains of layers: analysis.training_chain). Pure. docs/training.md derives each term; in short:

- Devices form the mesh (p, d, t), t fastest (Megatron-LM's order), so the link class each parallel dimension's
  groups span prices its collectives through analysis.pricing (one definition per collective, link sharing
  included): axis 0 carries the pipeline's point-to-point messages, axis 1 the data-parallel and ZeRO collectives,
  axis 2 the tensor-parallel ones.
- Compute is every GEMM of a layer by shape (forward; backward its input and weight gradients) at the
  calibration's GEMM model, latency plus flops at the rate over the share of SMs its waves of output tiles keep
  busy, or its operands' and result's bytes at the copy rate where longer (a roofline); memory-bound kernels
  (norms, softmax, dropout, GeLU, bias gradients, copies, the fp32 cross-entropy, and each micro-batch's weight
  gradients added into the gradient buffer) are each a call at the copy model, latency plus bytes at the copy
  rate, counted forward and backward. Recomputation repeats the attention core (selective) or the forward (full).
- Tensor parallelism all-reduces the activation twice each way per layer, or with sequence parallelism
  reduce-scatters and all-gathers it (and all-gathers the sharded norm outputs again in the backward); full
  recomputation repeats the forward ones. Collectives Megatron overlaps with GEMMs count in full.
- A step is m micro-batches through the slowest stage, plus the schedule's bubble, plus its point-to-point
  messages (1/t of the activation each, all-gathered at the receiver without SP: Megatron's scatter/gather) and
  the tied word embedding's gradient all-reduce between the first and last stage, plus
  the data-parallel collectives not hidden behind the backward pass, plus the optimizer (Megatron's mixed-precision
  Adam step: its bytes at the copy rate).
- Terms names these modelling choices so that benchmarks.published can show what each does to the error.
- Memory per device (the first stage, which holds the most): fp16 parameters and gradients and fp32 Adam states
  (ZeRO 1 shards the states, 2 the gradients too, 3 the parameters too) and activations by Korthikanti et al. 2022
  (Table 2, by recomputation and sequence parallelism) times the schedule's in-flight micro-batches."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import cached_property

from analysis.mesh import Mesh
from analysis.models import parse_spec
from analysis.pricing import Pricer
from analysis.schedules import Schedule, parse_schedule
from microbench.errors import UsageError
from microbench.ops import itemsize

RECOMPUTE = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)
PARAM_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 2, 2, 12
"""Mixed-precision Adam per parameter: fp16 weights and gradients, fp32 master weights, momentum and variance
(the ZeRO paper's K = 12)."""
ADAM_TRAFFIC_BYTES = 28
"""Bytes an Adam step reads and writes per parameter it updates: fp32 weight, momentum, variance in and out, the
fp16 gradient in and the fp16 weight out (in fp32 throughout, without a master copy: weight, momentum and variance
in and out and the gradient in, 28 as well)."""
OPTIMIZER_TRAFFIC_BYTES = 54
"""Bytes Megatron-LM's mixed-precision optimizer step moves per parameter: fp16 gradient to fp32 (2 + 4), unscale
with the overflow check (4 + 4), the gradient norm for clipping (4), Adam on fp32 gradient, weight, momentum and
variance (16 + 12), fp32 weight to fp16 (4 + 2), zeroing the fp16 gradient (2)."""
AXES = {"pp": 0, "dp": 1, "tp": 2}
"""The mesh axis of each parallel dimension: (p, d, t), t varying fastest."""


@dataclass(frozen=True)
class Terms:
    """The modelling choices a step is priced with, all on (the model); benchmarks.published --ablation switches
    each off in turn to show what it does to the error against published runs (docs/training.md)."""

    gemm_traffic: bool = True       # a GEMM's operands and result at the copy rate where that is longer (roofline)
    gemm_waves: bool = True         # output in whole tiles, in whole waves over the SMs
    kernels: bool = True            # memory-bound kernels priced (off: free)
    kernel_passes: bool = True      # each backward kernel counted (off: twice the forward's traffic)
    optimizer_passes: bool = True   # the mixed-precision optimizer's passes (off: Adam's alone)
    pp_gather: bool = True          # scatter/gather's all-gather after each pipeline message (no SP)
    sp_regather: bool = True        # SP's backward all-gathers of the sharded norm outputs, counted like the rest
    grad_accumulation: bool = True  # each micro-batch's weight gradients added into the gradient buffer
    loss_fp32: bool = True          # cross-entropy on fp32 logits (off: three fp16 passes each way)
    embedding_allreduce: bool = True  # the tied word embedding's gradient all-reduced between first and last stage


@dataclass(frozen=True)
class Transformer:
    """A GPT-style model: layers of hidden size h with `heads` heads and an ffn-wide MLP, sequences of `seq`
    tokens, a vocabulary (tied input and output embedding) and the global batch in sequences."""

    name: str
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    ffn: int
    batch: int

    @classmethod
    def parse(cls, spec: str) -> "Transformer":
        """From a model spec of analysis.models (a transformer preset or `transformer:d=...,heads=...`)."""
        kind, p = parse_spec(spec)
        if kind != "transformer":
            raise UsageError(f"a training step prices transformers; {spec!r} is a {kind}")
        if p["head_dim"] and p["head_dim"] * p["heads"] != p["d"]:
            raise UsageError(f"transformer: heads x head_dim must equal d for a training step ({spec!r})")
        return cls(spec, p["layers"], p["d"], p["heads"], p["seq"], p["vocab"], p["ffn"] or 4 * p["d"], p["batch"])

    @property
    def layer_params(self) -> int:
        """Weights and biases of one layer: QKV, projection, two MLP matrices, two layer norms."""
        h, f = self.hidden, self.ffn
        return 4 * h * h + 2 * h * f + 9 * h + f

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + (self.vocab + self.seq) * self.hidden

    def flops(self, recompute: str = "full") -> float:
        """FLOPs of one step as Narayanan et al. 2021 count them (eq. 3 with full recomputation: 4 passes)."""
        b, s, h, L, V = self.batch, self.seq, self.hidden, self.layers, self.vocab
        passes = {"none": 3, "selective": 3, "full": 4}[recompute]
        return passes * 24 * b * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h) * 4 / passes)


@dataclass(frozen=True)
class Config:
    """One parallel configuration; the micro-batch count follows from the global batch (m = batch / (d mb))."""

    t: int
    p: int
    d: int
    micro_batch: int
    schedule: Schedule = Schedule("1f1b")
    zero: int = 0
    sp: bool = False
    recompute: str = "none"
    dp_overlap: bool = False

    def __str__(self) -> str:
        return (f"t{self.t} p{self.p} d{self.d} mb{self.micro_batch} {self.schedule} zero{self.zero}"
                f"{' sp' if self.sp else ''} rc:{self.recompute}{' overlap' if self.dp_overlap else ''}")

    def to_dict(self) -> dict:
        return {**asdict(self), "schedule": self.schedule.name, "v": self.schedule.v}


CONFIG_KEYS = {"t": int, "p": int, "d": int, "mb": int, "schedule": str, "v": int, "zero": int, "sp": bool,
               "recompute": str, "overlap": bool}


def parse_config(text: str) -> Config:
    """'t=8,p=8,d=1,mb=1,schedule=interleaved,v=3,zero=1,sp=1,recompute=selective,overlap=1' (t, p, d, mb
    required; defaults 1f1b, zero 0, no sp, no recomputation, no overlap). A key given twice or an empty item is
    refused: one value would hide the other."""
    given: dict = {}
    for item in (x.strip() for x in text.split(",")):
        key, eq, val = item.partition("=")
        key = key.strip()
        if not eq or key not in CONFIG_KEYS:
            raise UsageError(f"config {text!r}: {item!r} is not one of {', '.join(f'{k}=' for k in CONFIG_KEYS)}")
        if key in given:
            raise UsageError(f"config {text!r} gives {key} more than once")
        kind = CONFIG_KEYS[key]
        val = val.strip().lower()
        if kind is bool:
            if val not in ("0", "1", "on", "off", "true", "false"):
                raise UsageError(f"config {text!r}: {key} takes 0/1 (or on/off), not {val!r}")
            given[key] = val in ("1", "on", "true")
        elif kind is int:
            if not val.isdecimal() or int(val) < (0 if key == "zero" else 1):
                raise UsageError(f"config {text!r}: {key}={val!r} is not a positive integer")
            given[key] = int(val)
        else:
            given[key] = val
    missing = [k for k in ("t", "p", "d", "mb") if k not in given]
    if missing:
        raise UsageError(f"config {text!r} lacks {', '.join(missing)}")
    if given.get("zero", 0) not in ZERO_STAGES:
        raise UsageError(f"config {text!r}: zero must be one of {ZERO_STAGES}")
    if given.get("recompute", "none") not in RECOMPUTE:
        raise UsageError(f"config {text!r}: recompute must be one of {', '.join(RECOMPUTE)}")
    schedule = parse_schedule(given.get("schedule", "1f1b"), given.get("v", 1))
    if "v" in given and schedule.name != "interleaved" and given["v"] != 1:
        raise UsageError(f"config {text!r}: v={given['v']} applies only to schedule=interleaved, not {schedule}")
    if "v" in given and schedule.v != given["v"]:
        raise UsageError(f"config {text!r} gives v={given['v']} and schedule {schedule}: one would hide the other")
    return Config(given["t"], given["p"], given["d"], given["mb"], schedule, given.get("zero", 0),
                  given.get("sp", False), given.get("recompute", "none"), given.get("overlap", False))


@dataclass(frozen=True)
class Memory:
    """Bytes per device on the first pipeline stage (the one holding the most)."""

    params: float
    grads: float
    optimizer: float
    activations: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations

    def to_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


@dataclass(frozen=True)
class Step:
    """A configuration's predicted step: seconds by part (compute + recompute + tp + pp + bubble + dp_exposed +
    optimizer = total; dp_overlapped is hidden behind the backward pass and shown apart), memory per device, the
    link class each parallel dimension's collectives were priced on, and why it cannot run (None: it can)."""

    config: Config
    micro_batches: int
    total_s: float = math.inf
    compute_s: float = 0.0
    recompute_s: float = 0.0
    tp_comm_s: float = 0.0
    pp_comm_s: float = 0.0
    bubble_s: float = 0.0
    dp_exposed_s: float = 0.0
    dp_overlapped_s: float = 0.0
    optimizer_s: float = 0.0
    memory: Memory | None = None
    links: dict = field(default_factory=dict)
    reason: str | None = None

    @property
    def feasible(self) -> bool:
        return self.reason is None

    PARTS = ("compute_s", "recompute_s", "tp_comm_s", "pp_comm_s", "bubble_s", "dp_exposed_s", "optimizer_s")

    def to_dict(self) -> dict:
        out = {"config": str(self.config), **self.config.to_dict(), "micro_batches": self.micro_batches,
               "feasible": self.feasible, "reason": self.reason, "total_s": self.total_s}
        out.update({k: getattr(self, k) for k in (*self.PARTS, "dp_overlapped_s")})
        out["memory_bytes"] = None if self.memory is None else self.memory.to_dict()
        out["links"] = dict(self.links)
        return out


@dataclass(frozen=True)
class LayerTimes:
    """One layer and one micro-batch on one device: seconds of each pass (forward, backward, recomputation) and of its
    tensor-parallel communication in each."""

    fwd: float
    bwd: float
    rec: float
    tp_fwd: float
    tp_bwd: float
    tp_rec: float

    @property
    def compute(self) -> float:
        return self.fwd + self.bwd

    @property
    def tp(self) -> float:
        return self.tp_fwd + self.tp_bwd + self.tp_rec

    @property
    def total(self) -> float:
        return self.compute + self.rec + self.tp


@dataclass(frozen=True)
class StageTimes:
    """What a step's assembly needs of a model's pipeline stages, per micro-batch: the slowest device's seconds
    (compute, recomputation, tensor-parallel communication), the mean device's (the bubble's unit), the forward and
    backward windows data-parallel collectives may hide behind, the pipeline message's bytes per device, the
    parameters per device (the device holding most) and the layers per device (host MPI's per-layer all-reduces)."""

    compute: float
    recompute: float
    tp: float
    mean: float
    fwd: float
    bwd: float
    message_bytes: float
    params: float
    layers: int

    @property
    def slowest(self) -> float:
        return self.compute + self.recompute + self.tp


class StepPricer:
    """What pricing a training step shares across model kinds: the machine (calibration, devices, devices per node,
    dtype, memory), a pricer per mesh (p, d, t), the step's assembly from a model's StageTimes (pipeline messages,
    bubble, data-parallel and ZeRO collectives, optimizer) and the parameter memory by ZeRO stage. A subclass says
    why a configuration cannot run (`problem`), what its stages cost (`_stage_times`), its parameters per device
    (`stage_params`) and its activation bytes per device (`activations`)."""

    def __init__(self, calibration, model, devices: int, gpus_per_node: int, dtype: str,
                 nics_per_node: int = 1, memory_bytes: float | None = None, terms: Terms = Terms(),
                 mixed: bool = True):
        if devices < 1 or gpus_per_node < 1:
            raise UsageError("--devices and --gpus-per-node must be at least 1")
        if devices > gpus_per_node and devices % gpus_per_node:
            raise UsageError(f"{devices} devices do not fill nodes of {gpus_per_node}")
        self.cal = calibration
        self.model = model
        self.devices = devices
        self.gpus_per_node = min(gpus_per_node, devices)
        self.dtype = dtype
        self.itemsize = itemsize(dtype)
        self.nics_per_node = nics_per_node
        self.memory_bytes = memory_bytes
        self.mixed = mixed
        self.param_bytes, self.grad_bytes, self.optimizer_bytes = (PARAM_BYTES, GRAD_BYTES, OPTIMIZER_BYTES) if mixed \
            else (self.itemsize, self.itemsize, 2 * self.itemsize)
        """Bytes per parameter: mixed precision (fp16 weights and gradients, fp32 Adam states and master weights), or
        (mixed=False, as the validation harness trains) everything in `dtype` with no master copy, and a plain Adam
        step (ADAM_TRAFFIC_BYTES) for the optimizer."""
        self.terms = terms
        self.async_progress = calibration.backend == "nccl"
        """Whether a collective started during the backward pass progresses while it computes: NCCL's kernels run on
        their own stream; host MPI advances a non-blocking collective only inside MPI calls (measured by the
        harness: docs/results.md, "Training configurations on 4 ranks"), so there DP overlap hides nothing and
        its per-layer all-reduces each pay their latency at the final wait."""
        self._wave = calibration.gemm_wave(dtype)
        self._pricers: dict[tuple[int, int, int], Pricer] = {}
        self._comms: dict[tuple, float] = {}
        self._dims: dict[tuple, dict[str, str]] = {}
        self._memory: dict[tuple, Memory] = {}

    def pricer(self, t: int, p: int, d: int) -> Pricer:
        key = (t, p, d)
        if key not in self._pricers:
            self._pricers[key] = Pricer(self.cal, Mesh((p, d, t), self.gpus_per_node), self.dtype, self.nics_per_node)
        return self._pricers[key]

    @cached_property
    def _probe(self) -> Pricer:
        return self.pricer(1, 1, self.devices)

    def _comm(self, pricer: Pricer, op: str, dim: str, nbytes: float) -> float:
        """One collective's seconds, remembered: a search prices the same few calls for thousands of configurations."""
        key = (id(pricer), op, dim, nbytes)
        if key not in self._comms:
            self._comms[key] = float(pricer.seconds(op, AXES[dim], [nbytes])[0])
        return self._comms[key]

    def _traffic(self, *kernels: float) -> float:
        """Memory-bound kernels given by the elements each reads and writes: each a call of its own at the
        calibration's copy model, latency plus bytes at the copy rate."""
        return sum(self._probe.traffic_seconds(e) for e in kernels)

    def micro_batches(self, c: Config) -> int:
        """m = the global batch / (d x micro-batch size); 0 where it does not divide."""
        per = c.d * c.micro_batch
        return 0 if self.model.batch % per else self.model.batch // per

    def memory(self, c: Config, m: int) -> Memory:
        """Bytes per device, remembered per configuration up to data-parallel overlap (which moves no bytes)."""
        key = (c.t, c.p, c.d, c.micro_batch, c.schedule, c.zero, c.sp, c.recompute)
        if key not in self._memory:
            self._memory[key] = self._memory_of(c, m)
        return self._memory[key]

    def _memory_of(self, c: Config, m: int) -> Memory:
        P = self.stage_params(c)
        shard = lambda stage: c.d if c.zero >= stage else 1  # noqa: E731
        return Memory(P * self.param_bytes / shard(3), P * self.grad_bytes / shard(2),
                      P * self.optimizer_bytes / shard(1), self.activations(c, m))

    def price(self, c: Config) -> Step:
        """The predicted step of configuration c (infeasible ones carry their reason, and memory where known)."""
        reason = self.problem(c)
        m = self.micro_batches(c)
        if reason:
            return Step(c, m, reason=reason)
        mem = self.memory(c, m)
        if self.memory_bytes is not None and mem.total > self.memory_bytes:
            return Step(c, m, memory=mem, reason=f"needs {mem.total / 2**30:.1f} GiB per device (activations "
                        f"{mem.activations / 2**30:.1f} GiB), over the device's {self.memory_bytes / 2**30:.1f} GiB")
        st = self._stage_times(c)
        pricer = self.pricer(c.t, c.p, c.d)
        pp = 0.0 if c.p == 1 else (c.schedule.messages(c.p, m) * self._message(c, pricer, st.message_bytes)
                                   + self._tied(c, pricer))
        dp_total, dp_exposed = self._dp(c, m, pricer, st)
        handled = st.params / (c.d if c.zero >= 1 else 1)
        per_param = OPTIMIZER_TRAFFIC_BYTES if self.terms.optimizer_passes and self.mixed else ADAM_TRAFFIC_BYTES
        optimizer = self._traffic(handled * per_param / self.itemsize)
        bubble = c.schedule.bubble_slots(c.p) * st.mean
        total = m * st.slowest + bubble + pp + dp_exposed + optimizer
        return Step(c, m, total, m * st.compute, m * st.recompute, m * st.tp, pp, bubble, dp_exposed,
                    dp_total - dp_exposed, optimizer, mem, self._links(c, pricer))

    def _tied(self, c: Config, pricer: Pricer) -> float:
        """Seconds the pipeline adds beyond its messages (none here; the transformer's tied embedding)."""
        return 0.0

    def _message(self, c: Config, pricer: Pricer, nbytes: float) -> float:
        """One pipeline message: 1/t of the activation each way between stages, then (without SP, whose
        activations are already split) the receiving stage's all-gather of the whole (Megatron's scatter/gather)."""
        gather = c.t > 1 and not c.sp and self.terms.pp_gather
        return self._comm(pricer, "pingpong", "pp", nbytes) + (
            self._comm(pricer, "allgather", "tp", nbytes * c.t) if gather else 0.0)

    def _links(self, c: Config, pricer: Pricer) -> dict[str, str]:
        """The link class each parallel dimension of c communicates on (after fallback), remembered per mesh."""
        key = (id(pricer), c.sp, c.zero == 0)
        if key not in self._dims:
            self._dims[key] = {dim: self._link(pricer, op, dim) for dim, op, used in (
                ("tp", "reduce_scatter" if c.sp else "allreduce", c.t > 1), ("pp", "pingpong", c.p > 1),
                ("dp", "allreduce" if c.zero == 0 else "reduce_scatter", c.d > 1)) if used}
        return dict(self._dims[key])

    def _link(self, pricer: Pricer, op: str, dim: str) -> str:
        wanted = pricer.mesh.axes[AXES[dim]].link
        used = pricer.link(op, AXES[dim])
        return wanted if used == wanted else f"{wanted} (priced as {used})"

    def _dp(self, c: Config, m: int, pricer: Pricer, st: StageTimes) -> tuple[float, float]:
        """(all, exposed) seconds of the data-parallel collectives of a step. The gradient reduction of the last
        micro-batch hides behind its backward pass, ZeRO 1/2's parameter all-gather behind the next step's first
        forward, ZeRO 3's per-micro-batch gathers and reductions behind each forward and backward; without
        overlap everything is exposed."""
        if c.d == 1:
            return 0.0, 0.0
        P, fwd, bwd = st.params, st.fwd, st.bwd
        grads, params = P * self.grad_bytes, P * self.param_bytes
        comm = lambda op, nbytes: self._comm(pricer, op, "dp", nbytes)  # noqa: E731
        overlaps = c.dp_overlap and self.async_progress
        hidden = (lambda s, window: max(0.0, s - window)) if overlaps else (lambda s, window: s)  # noqa: E731
        if c.zero == 0:
            if c.dp_overlap and not self.async_progress:     # one all-reduce per layer, all run at the final wait
                n = max(1, st.layers)
                s = n * comm("allreduce", grads / n)
                return s, s
            s = comm("allreduce", grads)
            return s, hidden(s, bwd)
        rs, ag = comm("reduce_scatter", grads), comm("allgather", params)
        if c.zero == 1:
            return rs + ag, hidden(rs, bwd) + hidden(ag, fwd)
        if c.zero == 2:
            return m * rs + ag, m * hidden(rs, bwd) + hidden(ag, fwd)
        return m * (2 * ag + rs), m * (hidden(ag, fwd) + hidden(ag + rs, bwd))

    def fallbacks(self):
        """Every collective priced by another link class's models, over all pricers used."""
        seen = {}
        for pricer in self._pricers.values():
            for f in pricer.fallbacks():
                seen[(f.op, f.axis, f.wanted, f.used)] = f
        return list(seen.values())


class TrainingPricer(StepPricer):
    """Prices configurations of a transformer, caching what configurations share: a pricer per (t, p, d), a layer's
    times per (t, mb, sp, recompute)."""

    def __init__(self, calibration, model: Transformer, devices: int, gpus_per_node: int, dtype: str,
                 nics_per_node: int = 1, memory_bytes: float | None = None, terms: Terms = Terms(),
                 mixed: bool = True):
        super().__init__(calibration, model, devices, gpus_per_node, dtype, nics_per_node, memory_bytes, terms, mixed)
        self._layers: dict[tuple, tuple[LayerTimes, LayerTimes, LayerTimes]] = {}
        self._stages: dict[tuple, StageTimes] = {}

    def _gemms(self, shapes, backward: bool = False) -> float:
        """Seconds of GEMMs given as (batch, m, n, k): each call at the calibration's GEMM model (latency plus flops
        at the rate) or, where longer, its operands and result at the copy rate (a roofline; Terms.gemm_traffic);
        backward: each GEMM's two, the input gradient (batch, m, k, n) and the weight gradient (batch, k, n, m)."""
        if backward:
            shapes = [g for bt, m, n, k in shapes for g in ((bt, m, k, n), (bt, k, n, m))]
        total = 0.0
        for bt, m, n, k in shapes:
            elements = bt * (m * k + k * n + m * n) if self.terms.gemm_traffic else 0.0
            total += self._probe.compute_seconds(2.0 * bt * m * n * k / self._waves(bt, m, n), elements)
        return total

    def _waves(self, bt: int, m: int, n: int) -> float:
        """The share of the tile slots a GEMM's output fills: whole tiles (tile quantization) in whole waves of one tile
        per SM (wave quantization); 1 where the calibration gives no tiles."""
        if self._wave is None or not self.terms.gemm_waves:
            return 1.0
        per_wave, rows, cols = self._wave
        if bt * m * n == 0:                                  # an empty product (a layer of size 0): no tile to fill
            return 1.0
        best = 0.0
        for tm, tn in ((rows, cols), (cols, rows)):         # the library picks the better orientation
            slots = math.ceil(bt * -(-m // tm) * -(-n // tn) / per_wave) * per_wave * tm * tn
            best = max(best, bt * m * n / slots)
        return best

    def _accumulate(self, *tensors: float) -> float:
        """One micro-batch's gradients of these parameter tensors (elements each) added into the gradient buffer:
        Megatron-LM's main_grad.add_ per tensor, reading both and writing one (Terms.grad_accumulation)."""
        return self._traffic(*(3 * n for n in tensors)) if self.terms.grad_accumulation else 0.0

    def _loss(self, logits: float) -> tuple[float, float]:
        """(forward, backward) seconds of the vocabulary-parallel cross-entropy over `logits` elements. Mixed
        precision: on fp32 logits (Megatron-LM's default), bytes per logit forward 6 (to fp32), 4 (max), 8
        (subtract), 8 (exp), 4 (sum), 8 (divide), backward 8 (times the loss gradient), 6 (to fp16); else (or
        Terms.loss_fp32 off) three passes each way."""
        if not (self.terms.loss_fp32 and self.mixed):
            return self._traffic(3 * logits), self._traffic(3 * logits)
        per = logits / self.itemsize
        return self._traffic(*(b * per for b in (6, 4, 8, 8, 4, 8))), self._traffic(8 * per, 6 * per)

    def _layers_of(self, c: Config) -> tuple[LayerTimes, LayerTimes, LayerTimes]:
        """(a transformer layer, the first stage's embedding, the last stage's output layer) for one micro-batch."""
        key = (c.t, c.p, c.d, c.micro_batch, c.sp, c.recompute)
        if key not in self._layers:
            self._layers[key] = self._price_layers(c)
        return self._layers[key]

    def _price_layers(self, c: Config) -> tuple[LayerTimes, LayerTimes, LayerTimes]:
        m, t, b = self.model, c.t, c.micro_batch
        s, h, a, f, V = m.seq, m.hidden, m.heads, m.ffn, m.vocab
        tokens, hd = b * s, h // a
        gemms, traffic = self._gemms, self._traffic
        core = [(b * a // t, s, s, hd), (b * a // t, s, hd, s)]            # scores QK^T and context AV, per head
        dense = [(1, tokens, 3 * h // t, h), (1, tokens, h, h // t), (1, tokens, f // t, h), (1, tokens, h, f // t)]
        hs = tokens * h / (t if c.sp else 1)                    # replicated norm/dropout regions (split with SP)
        A, H, F = b * a * s * s / t, tokens * h / t, tokens * f / t
        kf, kb = self._kernels(hs, A, H, F)
        fwd_core = gemms(core) + traffic(*kf["core"])
        fwd = fwd_core + gemms(dense) + traffic(*kf["rest"])
        weights = (3 * h * h / t, 3 * h / t, h * h / t, h, h * f / t, f / t, h * f / t, h, h, h, h, h)
        bwd = gemms(core + dense, backward=True) + traffic(*kb["core"], *kb["rest"]) + self._accumulate(*weights)
        rec = {"none": 0.0, "selective": fwd_core, "full": fwd}[c.recompute]
        act = tokens * h * self.itemsize
        pricer = self.pricer(c.t, c.p, c.d)
        if t == 1:
            tp_fwd = 0.0
        elif c.sp:
            tp_fwd = 2 * (self._comm(pricer, "allgather", "tp", act) + self._comm(pricer, "reduce_scatter", "tp", act))
        else:
            tp_fwd = 2 * self._comm(pricer, "allreduce", "tp", act)
        regather = 2 * self._comm(pricer, "allgather", "tp", act) if c.sp and self.terms.sp_regather else 0.0
        layer = LayerTimes(fwd, bwd, rec, tp_fwd, tp_fwd + regather, tp_fwd if c.recompute == "full" else 0.0)
        one_way = 0.0 if t == 1 else self._comm(pricer, "reduce_scatter" if c.sp else "allreduce", "tp", act)
        embed = LayerTimes(traffic(2 * tokens * h), traffic(2 * tokens * h) + self._accumulate(V * h / t, s * h),
                       0.0, one_way, 0.0, 0.0)
        logits = [(1, tokens, V // t, h)]
        gather = 0.0 if not (t > 1 and c.sp) else self._comm(pricer, "allgather", "tp", act)
        loss_fwd, loss_bwd = self._loss(tokens * V / t)
        head = LayerTimes(gemms(logits) + loss_fwd + traffic(2 * hs),
                      gemms(logits, backward=True) + loss_bwd + self._accumulate(V * h / t), 0.0, gather, gather, 0.0)
        return layer, embed, head

    def _kernels(self, hs: float, A: float, H: float, F: float) -> tuple[dict, dict]:
        """Elements each memory-bound kernel of a layer reads and writes (a byte mask counts half an element),
        forward and backward, split into the attention core (what selective recomputation repeats) and the rest.
        hs: the norm/dropout region (b s h, /t with SP); A: attention scores (b a s^2 / t); H: b s h / t;
        F: b s f / t. Terms.kernels off: none; Terms.kernel_passes off: backward twice the forward."""
        if not self.terms.kernels:
            return {"core": (), "rest": ()}, {"core": (), "rest": ()}
        fwd = {"core": (2 * A, 2.5 * A),                         # scale-mask-softmax; dropout with its mask
               "rest": (2 * hs, 3.5 * hs, 2 * hs, 3.5 * hs, 2 * F)}     # norms, bias-dropout-adds, bias-GeLU
        if not self.terms.kernel_passes:
            return fwd, {k: tuple(2 * e for e in v) for k, v in fwd.items()}
        fwd["core"] += (2 * H,)                                 # context heads back to [s, b, h/t] (a copy)
        bwd = {"core": (3 * A, 2.5 * A, 2 * H),                 # softmax and dropout backward; the context copy
               "rest": (5 * hs, 5 * hs)                         # norms: dx, and the scale/shift gradients
               + 2 * (2.5 * hs, hs, 3 * hs)                     # dropout backward, bias gradient, residual add
               + (4 * F,)                                       # GeLU backward and its bias gradient
               + (6 * H, 3 * H)}                                # Q, K, V gradients joined; QKV bias gradient
        return fwd, bwd

    def stage_params(self, c: Config) -> float:
        """Parameters per device on the first stage: its layers' share and the (tied) embedding's, split t ways."""
        m = self.model
        return (m.layers // c.p * self._layer_params + (m.vocab + m.seq) * m.hidden) / c.t

    @cached_property
    def _layer_params(self) -> float:
        return self.model.layer_params

    def activation_bytes(self, c: Config, recompute: str | None = None) -> float:
        """Korthikanti et al. 2022's activation bytes of one layer and micro-batch per device (Table 2): fp16,
        a dropout mask byte per element; with full recomputation only the layer's input is kept. `recompute`
        overrides c's."""
        m = self.model
        recompute = recompute or c.recompute
        sbh = m.seq * c.micro_batch * m.hidden
        attn = 5 * m.heads * m.seq / m.hidden
        if recompute == "full":
            return 2 * sbh / (c.t if c.sp else 1)
        core = 0.0 if recompute == "selective" else attn
        return sbh * (34 + core) / c.t if c.sp else sbh * (10 + (24 + core) / c.t)

    def _stage_times(self, c: Config) -> StageTimes:
        """The slowest stage: n layers and the embedding (first) or the output layer (last), both with p = 1;
        remembered per (t, p, d, micro-batch, SP, recomputation), which is all it depends on."""
        key = (c.t, c.p, c.d, c.micro_batch, c.sp, c.recompute)
        if key not in self._stages:
            self._stages[key] = self._stage_times_of(c)
        return self._stages[key]

    def _stage_times_of(self, c: Config) -> StageTimes:
        layer, embed, head = self._layers_of(c)
        n = self.model.layers // c.p
        if c.p == 1:
            extras = [embed, head]
        else:
            extras = [embed if n * layer.total + embed.total >= n * layer.total + head.total else head]
        m = self.model
        return StageTimes(n * layer.compute + sum(x.compute for x in extras), n * layer.rec,
                          n * layer.tp + sum(x.tp for x in extras), n * layer.total + (embed.total + head.total) / c.p,
                          n * layer.fwd + embed.fwd, n * layer.bwd + embed.bwd,
                          m.seq * c.micro_batch * m.hidden * self.itemsize / c.t, self.stage_params(c), n)

    def activations(self, c: Config, m: int) -> float:
        """The first stage's activation bytes: its layers' by activation_bytes, times the schedule's in-flight
        micro-batches; with full recomputation also the one layer being recomputed, which holds all of its own."""
        acts = self.model.layers // c.p * self.activation_bytes(c) * c.schedule.in_flight(c.p, m)
        if c.recompute == "full":
            acts += self.activation_bytes(c, "none")
        return acts

    def problem(self, c: Config) -> str | None:
        """Why configuration c cannot run this model on these devices (before memory), or None."""
        m = self.model
        if c.t * c.p * c.d != self.devices:
            return f"t x p x d = {c.t * c.p * c.d}, not the {self.devices} devices"
        if m.heads % c.t or m.ffn % c.t:
            return f"t={c.t} does not divide the {m.heads} heads and the MLP width {m.ffn}"
        if m.batch % (c.d * c.micro_batch):
            return f"the global batch of {m.batch} does not split into d={c.d} x micro-batches of {c.micro_batch}"
        if c.sp and c.t == 1:
            return "sequence parallelism needs tensor parallelism (t > 1)"
        if c.zero and c.d == 1:
            return "ZeRO shards across data parallelism: it needs d > 1"
        return c.schedule.problem(c.p, m.batch // (c.d * c.micro_batch), m.layers)

    def space(self, max_micro_batch: int = 8, max_v: int = 8):
        """This model's configurations worth pricing on these devices (module function `space`)."""
        return space(self.model, self.devices, max_micro_batch, max_v)

    def _tied(self, c: Config, pricer: Pricer) -> float:
        """The word embedding's gradient (the first and last stage each hold the tied copy) all-reduced by the two
        after the backward pass (Megatron-LM's train_step), on the pipeline axis's link (Terms.embedding_allreduce)."""
        if not (self.terms.embedding_allreduce and self.model.vocab):
            return 0.0
        key = ("tied", id(pricer))
        if key not in self._comms:
            link = pricer.link("allreduce", AXES["pp"])
            nbytes = self.model.vocab * self.model.hidden / c.t * self.grad_bytes
            self._comms[key] = math.inf if link is None else float(self.cal.predict_seconds(
                "allreduce", link, 2, [nbytes * pricer.sharing(link, AXES["pp"])])[0])
        return self._comms[key]


def divisors(n: int, upto: int | None = None) -> list[int]:
    """The divisors of n, up to `upto` where given."""
    return [k for k in range(1, min(upto or n, n) + 1) if n % k == 0]


def pipeline_schedules(p: int, vs) -> list[Schedule]:
    """The schedules a pipeline of p stages may run: 1F1B alone without one, else GPipe, 1F1B and interleaved 1F1B
    with each v of `vs` above 1."""
    if p == 1:
        return [Schedule("1f1b")]
    return [Schedule("gpipe"), Schedule("1f1b")] + [Schedule("interleaved", v) for v in vs if v > 1]


def configurations(devices: int, batch: int, shapes, max_micro_batch: int, sp: bool, recomputes):
    """Every configuration of each (t, p, schedules) in `shapes`, d = devices / (t p) dividing the global batch:
    micro-batches dividing the per-replica batch (up to max_micro_batch), each schedule (interleaved where p
    divides the micro-batch count), ZeRO 0-3 and overlap where d > 1, sequence parallelism (if `sp`) where t > 1,
    each of `recomputes`."""
    for t, p, scheds in shapes:
        d = devices // (t * p)
        if batch % d:
            continue
        for mb in divisors(batch // d, max_micro_batch):
            m = batch // (d * mb)
            for sched in scheds:
                if sched.name == "interleaved" and m % p:
                    continue
                for zero in ZERO_STAGES if d > 1 else (0,):
                    for overlap in (False, True) if d > 1 else (False,):
                        for on in (False, True) if sp and t > 1 else (False,):
                            for rc in recomputes:
                                yield Config(t, p, d, mb, sched, zero, on, rc, overlap)


def space(model: Transformer, devices: int, max_micro_batch: int = 8, max_v: int = 8):
    """Every configuration worth pricing: t dividing the heads, p the layers, d the rest; micro-batches dividing
    the per-replica batch (up to max_micro_batch); GPipe, 1F1B and interleaved with v dividing a stage's layers;
    ZeRO 0-3 and overlap where d > 1; sequence parallelism where t > 1; each recomputation."""
    shapes = ((t, p, pipeline_schedules(p, divisors(model.layers // p, max_v)))
              for t in divisors(devices) if not (model.heads % t or model.ffn % t)
              for p in divisors(devices // t) if not model.layers % p)
    return configurations(devices, model.batch, shapes, max_micro_batch, True, RECOMPUTE)
