"""A training step run for real on one device of a (p, d, t) mesh: the layers of its pipeline stage(s), each
micro-batch's activations received from the previous stage and its gradients from the next by point-to-point
messages in the order analysis.schedules gives the device (GPipe, 1F1B, interleaved), then the gradients reduced
over the data-parallel replicas (all-reduce, or ZeRO 1's reduce-scatter), the Adam update of what the device owns and
ZeRO 1's parameter all-gather. The layers are generic: a stack is anything with `layers` (their count), `batch`
and `seq` (activation rows: batch x seq), `shape(i, rows)` (the activation entering layer i, or leaving the last for
i = layers, for `rows` rows: stages may pass tensors of different shapes), `data(seed)` ({"weights": a dict of arrays
per layer, "X": input, "R": output gradient}), `shard(i, arrays, t, index)` (tensor-parallel member `index` of t's
share of layer i's weights or gradients) and `layer(i, params, allreduce, xp)`: an object whose `forward(x)` returns
(y, ctx) and `backward(ctx, dy)` (dx, weight gradients by name), `allreduce` summing a partial result over the
tensor-parallel group. TransformerStack is the one `commcal validate --training` runs; analysis.harness_cnn's
CnnStack (ParaDL's pipeline) the one `validate --model ... --strategies pipeline` runs. A single float64 process of
the same layers is the reference. Array module `xp` is a parameter; nothing here imports MPI."""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from analysis import kernels
from analysis.training import AXES, Config

PARTS = ("phase", "passes", "tp", "p2p", "dp")
"""What the pipeline phase's clock splits: the whole phase, its passes through the layers (tensor-parallel
collectives included), those collectives alone, sending and waiting for messages (the bubble included), and with DP
overlap waiting at the end for the gradient all-reduces started during the backward passes."""


@dataclass(frozen=True)
class Phase:
    """A timed phase of a training step (the harness's Item entry): its name and whether it communicates."""

    name: str
    is_comm: bool


class Clock:
    """Seconds this device spent in each of PARTS, summed over the phases it ran."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PARTS, 0.0)

    @contextmanager
    def __call__(self, part: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[part] += time.perf_counter() - t0

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PARTS, 0.0)

    def shares(self) -> np.ndarray:
        """The shares of the phase's time spent in compute (passes less their collectives), tensor-parallel
        collectives, messages and the overlapped gradient all-reduces' final wait."""
        s = self.seconds
        return np.array([s["passes"] - s["tp"], s["tp"], s["p2p"], s["dp"]]) / max(s["phase"], np.finfo(float).tiny)


class TransformerBlock:
    """A GPT block without biases, dropout or norm scales: x + proj(attn(qkv(ln(x)))), then + fc2(gelu(fc1(ln(.)))).
    Tensor-parallel over t as Megatron-LM splits it: the heads (qkv's columns, proj's rows) and the MLP's width (fc1's
    columns, fc2's rows), the partial sums after proj and fc2 all-reduced forward, the input gradients of qkv and fc1
    backward."""

    def __init__(self, params: dict, seq: int, head_dim: int, allreduce, xp=np):
        self.params, self.seq, self.hd, self.allreduce, self.xp = params, seq, head_dim, allreduce, xp

    def forward(self, x):
        xp, w = self.xp, self.params
        a, inv1 = kernels.layer_norm(xp, x)
        env = {"X": a @ w["qkv"]}
        env.update(kernels.attention_scores(xp, env["X"], self.seq, self.hd))
        c = kernels.attention_output(xp, env)
        x2 = x + self.allreduce(c @ w["proj"])
        a2, inv2 = kernels.layer_norm(xp, x2)
        u = a2 @ w["fc1"]
        g = kernels.ACTIVATIONS["gelu"][0](xp, u)
        return x2 + self.allreduce(g @ w["fc2"]), (a, inv1, env, c, a2, inv2, u, g)

    def backward(self, ctx, dy):
        xp, w = self.xp, self.params
        a, inv1, env, c, a2, inv2, u, g = ctx
        du = (dy @ w["fc2"].T) * kernels.ACTIVATIONS["gelu"][1](xp, u)
        dx2 = dy + kernels.layer_norm_grad(xp, a2, inv2, self.allreduce(du @ w["fc1"].T))
        env = {**env, "dY": dx2 @ w["proj"].T}
        env.update(kernels.attention_back_values(xp, env, self.seq, self.hd))
        dqkv = kernels.attention_back_inputs(xp, env, self.hd)
        dx = dx2 + kernels.layer_norm_grad(xp, a, inv1, self.allreduce(dqkv @ w["qkv"].T))
        return dx, {"qkv": a.T @ dqkv, "proj": c.T @ dx2, "fc1": a2.T @ du, "fc2": g.T @ dy}


SPLIT = {"qkv": 1, "proj": 0, "fc1": 1, "fc2": 0}
"""The axis of each weight that tensor parallelism splits (qkv's columns lie head by head)."""


@dataclass(frozen=True)
class TransformerStack:
    """The blocks of analysis.training's Transformer (its embedding and output layer left out: the loss is the
    output's dot product with seeded output gradients) on tokens x hidden activations."""

    layers: int
    hidden: int
    heads: int
    ffn: int
    seq: int
    batch: int

    @classmethod
    def of(cls, model) -> "TransformerStack":
        return cls(model.layers, model.hidden, model.heads, model.ffn, model.seq, model.batch)

    def shape(self, i: int, rows: int) -> tuple[int, int]:
        """Every activation between blocks: tokens x hidden."""
        return (rows, self.hidden)

    def data(self, seed: int) -> dict:
        """Seeded float64 weights of every layer, the global input X and the output gradient R (tokens x hidden)."""
        rng = np.random.default_rng(seed)
        h, f, tokens = self.hidden, self.ffn, self.batch * self.seq
        shapes = {"qkv": (h, 3 * h), "proj": (h, h), "fc1": (h, f), "fc2": (f, h)}
        weights = [{k: rng.standard_normal(s) / math.sqrt(s[0]) for k, s in shapes.items()} for _ in range(self.layers)]
        return {"weights": weights, "X": rng.standard_normal((tokens, h)), "R": rng.standard_normal((tokens, h))}

    def shard(self, i: int, arrays: dict, t: int, index: int) -> dict:
        """Tensor-parallel member `index` of t's blocks of layer i's weights (or gradients)."""
        return {k: np.split(v, t, axis=SPLIT[k])[index] for k, v in arrays.items()}

    def layer(self, i: int, params: dict, allreduce, xp=np) -> TransformerBlock:
        return TransformerBlock(params, self.seq, self.hidden // self.heads, allreduce, xp)


def _identity(buf):
    return buf


def reference(stack, data: dict) -> tuple[np.ndarray, list[dict]]:
    """(output, each layer's weight gradients) of the whole batch through all layers in one float64 process."""
    layers = [stack.layer(i, data["weights"][i], _identity) for i in range(stack.layers)]
    x, ctxs = data["X"], []
    for layer in layers:
        x, ctx = layer.forward(x)
        ctxs.append(ctx)
    dy, grads = data["R"], [None] * len(layers)
    for i in reversed(range(len(layers))):
        dy, grads[i] = layers[i].backward(ctxs[i], dy)
    return x, grads


@dataclass(frozen=True)
class Place:
    """This device's coordinate on the (p, d, t) mesh and the micro-batch count."""

    stage: int
    replica: int
    member: int
    micro_batches: int


class Flat:
    """A device's parameters in one contiguous buffer (padded to a multiple of `pad`) that its layers' params point
    into, and a gradient buffer of the same layout: what the data-parallel collectives and Adam work on."""

    def __init__(self, arrays: list[dict], pad: int, xp, dtype):
        sizes = [v.size for a in arrays for v in a.values()]
        n = -(-sum(sizes) // pad) * pad
        self.params, self.grads = xp.zeros(n, dtype=dtype), xp.zeros(n, dtype=dtype)
        self.views: list[dict] = []
        at = 0
        for a in arrays:
            views = {}
            for name, v in a.items():
                views[name] = (slice(at, at + v.size), v.shape)
                self.params[at:at + v.size] = xp.asarray(v.ravel(), dtype=dtype)
                at += v.size
            self.views.append(views)

    def param_views(self, i: int) -> dict:
        return {k: self.params[s].reshape(shape) for k, (s, shape) in self.views[i].items()}

    def span(self, i: int) -> slice:
        """Where layer i's parameters (and gradients) lie in the buffers."""
        views = list(self.views[i].values())
        return slice(views[0][0].start, views[-1][0].stop)

    def add_grads(self, i: int, grads: dict) -> None:
        for k, (s, shape) in self.views[i].items():
            self.grads[s].reshape(shape)[...] += grads[k]

    def flatten(self, arrays: list[dict]) -> np.ndarray:
        """Arrays of the same names and shapes as the parameters, laid out (and padded) as the buffer."""
        out = np.zeros(len(self.params))
        for views, a in zip(self.views, arrays):
            for k, (s, _) in views.items():
                out[s] = a[k].ravel()
        return out


class Adam:
    """Adam (lr 1e-4, betas 0.9/0.999) on a slice of the flat parameters, its moments in the same dtype."""

    def __init__(self, n: int, xp, dtype, lr: float = 1e-4, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8):
        self.m, self.v = xp.zeros(n, dtype=dtype), xp.zeros(n, dtype=dtype)
        self.lr, self.b1, self.b2, self.eps, self.xp = lr, b1, b2, eps, xp

    def update(self, w, g) -> None:
        xp = self.xp
        self.m *= self.b1
        self.m += (1 - self.b1) * g
        self.v *= self.b2
        self.v += (1 - self.b2) * g * g
        w -= self.lr * self.m / (xp.sqrt(self.v) + self.eps)


def unsupported(cfg: Config) -> str | None:
    """Why the harness cannot run configuration cfg, or None."""
    if cfg.zero > 1 or cfg.sp or cfg.recompute != "none" or (cfg.dp_overlap and cfg.zero):
        return "the harness runs ZeRO 0 and 1 without SP or recomputation, and DP overlap with ZeRO 0 only"
    return None


class TrainStep:
    """One configuration's training step on this device, in phases the harness times apart: `pipeline` (every
    pass of the schedule with its messages), `reduce` (the gradients over the replicas), `update` (Adam on what this
    device owns) and `gather` (ZeRO 1's parameters back to every replica). With DP overlap (ZeRO 0) each layer's
    gradient all-reduce starts (non-blocking) right after the layer's last backward pass, and the pipeline phase ends
    by waiting for them: host MPI advances them only inside MPI calls, so how much they hide is what is measured.
    Pipeline messages go as Megatron-LM sends them: each tensor-parallel rank sends its 1/t of the activation and the
    receiving stage all-gathers it over the tensor-parallel group. `cut`: the layer counts of the p v (virtual)
    stages in order (default: equal)."""

    def __init__(self, stack, data: dict, cfg: Config, place: Place, coll, xp=np, dtype="float32", clock=None,
                 cut: tuple[int, ...] | None = None):
        if unsupported(cfg):
            raise ValueError(f"{cfg}: {unsupported(cfg)}")
        self.cfg, self.place, self.coll, self.xp, self.stack = cfg, place, coll, xp, stack
        self.dtype = np.dtype(dtype)
        self.clock = clock or Clock()
        p, v, t = cfg.p, cfg.schedule.v, cfg.t
        cut = cut or (stack.layers // (p * v),) * (p * v)
        if len(cut) != p * v or sum(cut) != stack.layers:
            raise ValueError(f"{cut}: not the layer counts of {p * v} stages of {stack.layers} layers")
        self.starts = [0, *np.cumsum(cut).tolist()]
        self.chunks = [list(range(self.starts[c * p + place.stage], self.starts[c * p + place.stage + 1]))
                       for c in range(v)]
        self.indices = [i for chunk in self.chunks for i in chunk]
        shards = [stack.shard(i, data["weights"][i], t, place.member) for i in self.indices]
        self.flat = Flat(shards, cfg.d, xp, self.dtype)
        reduce_tp = self._tp if t > 1 else _identity
        self.layers = {i: stack.layer(i, self.flat.param_views(k), reduce_tp, xp) for k, i in enumerate(self.indices)}
        self.slot = {i: k for k, i in enumerate(self.indices)}
        rows = stack.batch // cfg.d * stack.seq
        micro = rows // place.micro_batches
        base = place.replica * rows
        cut = lambda a: [xp.asarray(a[base + k * micro:base + (k + 1) * micro], dtype=self.dtype)  # noqa: E731
                         for k in range(place.micro_batches)]
        self.inputs, self.out_grads = cut(data["X"]), cut(data["R"])
        self.micro = micro
        own = len(self.flat.params) // (cfg.d if cfg.zero else 1)
        self.owned = slice(place.replica * own, (place.replica + 1) * own) if cfg.zero else slice(None)
        self.adam = Adam(own, xp, self.dtype)
        self.order = cfg.schedule.order(p, place.micro_batches, place.stage)
        self.overlap = cfg.dp_overlap and cfg.d > 1
        self.final = {chunk: k for k, (kind, _, chunk) in enumerate(self.order) if kind == "B"}
        self.outputs: dict[int, object] = {}

    def _tp(self, buf):
        with self.clock("tp"):
            return self.coll.allreduce(self.xp.ascontiguousarray(buf), AXES["tp"])

    def pipeline(self) -> None:
        """Every pass of this device's schedule order; the last stage keeps its outputs by micro-batch."""
        cfg, xp = self.cfg, self.xp
        p, stages = cfg.p, cfg.p * cfg.schedule.v
        self.flat.grads[...] = 0
        stash, sends = {}, []
        tag = lambda kind, micro, stage: (micro * stages + stage) * 2 + (kind == "B")  # noqa: E731

        t, member = cfg.t, self.place.member

        def recv(kind, micro, stage):
            shape = self.stack.shape(self.starts[stage + (kind == "F")], self.micro)   # the boundary it crosses
            buf = xp.empty(math.prod(shape) // t, dtype=self.dtype)
            with self.clock("p2p"):
                self.coll.recv(buf, AXES["pp"], stage % p, tag(kind, micro, stage))
                return (self.coll.allgather(buf, AXES["tp"]) if t > 1 else buf).reshape(shape)

        def send(buf, kind, micro, stage, to):
            part = xp.ascontiguousarray(buf).reshape(t, -1)[member]
            with self.clock("p2p"):
                sends.append(self.coll.isend(part, AXES["pp"], to % p, tag(kind, micro, stage)))

        reducing = []
        t0 = time.perf_counter()
        for k, (kind, micro, chunk) in enumerate(self.order):
            stage = chunk * p + self.place.stage
            if kind == "F":
                x = self.inputs[micro] if stage == 0 else recv("F", micro, stage - 1)
                ctxs = []
                with self.clock("passes"):
                    for i in self.chunks[chunk]:
                        x, ctx = self.layers[i].forward(x)
                        ctxs.append(ctx)
                stash[(micro, chunk)] = ctxs
                if stage == stages - 1:
                    self.outputs[micro] = x
                else:
                    send(x, "F", micro, stage, stage + 1)
            else:
                dy = self.out_grads[micro] if stage == stages - 1 else recv("B", micro, stage + 1)
                ctxs = stash.pop((micro, chunk))
                with self.clock("passes"):
                    for i, ctx in zip(reversed(self.chunks[chunk]), reversed(ctxs)):
                        dy, grads = self.layers[i].backward(ctx, dy)
                        self.flat.add_grads(self.slot[i], grads)
                        if self.overlap and k == self.final[chunk]:
                            span = self.flat.span(self.slot[i])
                            reducing.append((span, *self.coll.iallreduce(self.flat.grads[span], AXES["dp"])))
                if stage:
                    send(dy, "B", micro, stage, stage - 1)
        with self.clock("p2p"):
            self.coll.wait(sends)
        with self.clock("dp"):
            self.coll.wait([req for _, req, _ in reducing])
            for span, _, out in reducing:
                self.flat.grads[span] = out
        self.clock.seconds["phase"] += time.perf_counter() - t0

    def reduce(self) -> None:
        cfg, flat = self.cfg, self.flat
        if cfg.d == 1 or self.overlap:
            return
        if cfg.zero:
            shard = self.coll.reduce_scatter(flat.grads.reshape(cfg.d, -1), AXES["dp"])
            flat.grads[self.owned] = shard
        else:
            flat.grads[...] = self.coll.allreduce(flat.grads, AXES["dp"])

    def update(self) -> None:
        self.adam.update(self.flat.params[self.owned], self.flat.grads[self.owned])

    def gather(self) -> None:
        if self.cfg.zero and self.cfg.d > 1:
            own = self.xp.ascontiguousarray(self.flat.params[self.owned])
            self.flat.params[...] = self.coll.allgather(own, AXES["dp"]).reshape(-1)

    def phases(self) -> list[tuple[Phase, object]]:
        """(phase, run) of each phase this configuration has, in order."""
        c = self.cfg
        out = [(Phase("pipeline", c.p > 1 or c.t > 1), self.pipeline)]
        if c.d > 1 and not self.overlap:
            out.append((Phase("reduce", True), self.reduce))
        out.append((Phase("update", False), self.update))
        if c.zero and c.d > 1:
            out.append((Phase("gather", True), self.gather))
        return out

    def errors(self, data: dict, want: tuple[np.ndarray, list[dict]]) -> np.ndarray:
        """Max |got - reference| / max |reference| of this device's outputs (last stage; else 0) and of the
        gradients it owns after the reduction, from one pipeline and reduce (run here, untimed) against the
        single-process reference `want`; leaves the parameters and the clock as they were."""
        self.pipeline()
        self.reduce()
        self.clock.reset()
        y, grads = want
        host = lambda a: np.asarray(a.get() if hasattr(a, "get") else a, dtype=np.float64)  # noqa: E731
        rel = lambda got, ref: float(np.abs(got - ref).max(initial=0.0)  # noqa: E731 (a stage may own no weights)
                                     / max(np.abs(ref).max(initial=0.0), np.finfo(float).tiny))
        out = 0.0
        if self.outputs:
            got = np.concatenate([host(self.outputs[k]) for k in sorted(self.outputs)])
            rows = len(got)
            out = rel(got, y[self.place.replica * rows:(self.place.replica + 1) * rows])
        ref = self.flat.flatten([self.stack.shard(i, grads[i], self.cfg.t, self.place.member) for i in self.indices])
        return np.array([out, rel(host(self.flat.grads[self.owned]), ref[self.owned])])

