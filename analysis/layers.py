"""Layers and their strategies. A strategy assigns each mesh axis one choice (a letter naming what the
axis splits); its stable id is the choices joined by "." plus "/ws" when weights are stored sharded
(ZeRO-3/SUMMA style: gathered before use, gradients reduce-scattered), e.g. "m.n.k", "-.n/ws".

  Linear      Y[m,n] = X[m,k] W[k,n]; choices m (rows of X: data parallel), n (columns of W: Megatron
              column), k (the reduction dim: Megatron row; Y is a partial sum), - (replicated).
  Attention   per-head attention core (scores recomputed in backward, not stored) on QKV [batch*seq, heads*3*head_dim] -> [batch*seq, heads*head_dim]
              (per token the QKV columns are laid out head by head); choices b (sequences), h (heads), -.
  Elementwise activation on [rows, cols]; choices r, c (split rows or columns), -; never takes a partial sum.
  Embedding   table [vocab, dim], token ids -> [tokens, dim]; choices dar / dag (tokens split, gradient
              exchanged as a dense allreduce / a sparse allgather of the touched rows, density rho), r
              (EmbRace: table rows split, lookups and their gradients exchanged by all-to-all), c, -.

`Layer.schedule(strategy, mesh, need_dx)` returns a `Schedule`: the forward and backward steps in execution
order, each a `Compute` (a local matmul/op with its local operand shapes and the analysis.kernels function that
computes it) or a redistribute.Step; the harness runs exactly these, and checks them against the same kernels run on
the whole arrays. A layer also names its data (`data_shapes`: global inputs, weights, output gradients), how each
is placed (`data_sigs`) and the outputs checked (`output_sigs`). Gradient signatures follow the matmul SBP rules per axis (S(0)xB=S(0),
BxS(1)=S(1), S(1)xS(0)=P, BxB=B): `sigs` gives x (input needed), y (output produced), dy (output
gradient needed) and dx (input gradient produced)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import ClassVar

from analysis import kernels
from analysis.mesh import Mesh
from analysis.redistribute import Plan, Step, plan
from analysis.sbp import B, P, Signature, Split, indivisible, local_shape
from microbench.errors import UsageError

OPTIMIZER_STATES = 2        # Adam: two moments per parameter, stored like the parameter


@dataclass(frozen=True)
class Strategy:
    choices: tuple[str, ...]
    sharded_weights: bool = False

    @property
    def id(self) -> str:
        return ".".join(self.choices) + ("/ws" if self.sharded_weights else "")


def parse_strategy(text: str) -> Strategy:
    """'m.n' or 'm.n/ws' (weights sharded): one choice per mesh axis; any other option after '/' is refused."""
    body, slash, opt = text.strip().partition("/")
    if slash and opt != "ws":
        raise UsageError(f"strategy {text!r}: the only option after '/' is ws (sharded weights)")
    return Strategy(tuple(body.split(".")), opt == "ws")


@dataclass(frozen=True)
class Compute:
    """A local computation: expr names operands (X, W, Y, dX, dW, dY, Q, K, V, A); shapes are local. kernel(xp, env)
computes it on the named buffers of env (analysis.kernels)."""

    expr: str
    operand_shapes: tuple[tuple[int, ...], ...]
    out_shape: tuple[int, ...]
    flops: float
    kernel: Callable | None = field(default=None, compare=False, repr=False)

    is_comm: ClassVar[bool] = False

    def run(self, xp, env: dict) -> None:
        self.kernel(xp, env)

    @property
    def elements(self) -> int:
        """Elements read and written, each operand and the output once: the memory traffic's lower bound."""
        return sum(math.prod(s) for s in self.operand_shapes) + math.prod(self.out_shape)


@dataclass(frozen=True)
class Sigs:
    x: Signature
    y: Signature
    dy: Signature
    dx: Signature


@dataclass(frozen=True)
class Schedule:
    strategy: Strategy
    forward: tuple = ()
    backward: tuple = ()
    memory_bytes: float = 0.0
    feasible: bool = True
    reason: str = ""

    @property
    def steps(self) -> tuple:
        return self.forward + self.backward


def _infeasible(strategy: Strategy, reason: str) -> Schedule:
    return Schedule(strategy, feasible=False, reason=reason, memory_bytes=math.inf)


def _per_axis(choices, table) -> Signature:
    return tuple(table[c] for c in choices)


def _plan_steps(p: Plan) -> tuple[Step, ...]:
    if not p.feasible:
        raise _Infeasible(p.reason)
    return p.steps


class _Infeasible(Exception):
    pass


@dataclass(frozen=True)
class Layer:
    """Common interface; subclasses define CHOICES, in_shape, out_shape, sigs and _schedule."""

    name: str
    itemsize: int

    CHOICES: ClassVar[tuple[str, ...]] = ()
    WEIGHTED: ClassVar[bool] = False
    PERMUTABLE_INPUT: ClassVar[frozenset[int]] = frozenset()
    """Input dims whose index order may arrive permuted: the layer contracts them with a weight it stores in
    the same order (AutoDDL), so the plan that feeds it may end in a permuting allgather."""

    def strategies(self, mesh: Mesh) -> list[Strategy]:
        out = [Strategy(c) for c in itertools.product(self.CHOICES, repeat=len(mesh.shape))]
        if self.WEIGHTED:
            out += [Strategy(s.choices, True) for s in out]
        return out

    def check(self, strategy: Strategy, mesh: Mesh) -> None:
        if len(strategy.choices) != len(mesh.shape) or any(c not in self.CHOICES for c in strategy.choices):
            raise _Infeasible(f"strategy {strategy.id!r} needs one of {', '.join(self.CHOICES)} per mesh axis "
                              f"({len(mesh.shape)} axes) for {type(self).__name__} {self.name}")
        if strategy.sharded_weights and not self.WEIGHTED:
            raise _Infeasible(f"{type(self).__name__} {self.name} has no weights to shard")

    def schedule(self, strategy: Strategy, mesh: Mesh, need_dx: bool = True) -> Schedule:
        try:
            self.check(strategy, mesh)
            return self._schedule(strategy, mesh, need_dx)
        except _Infeasible as exc:
            return _infeasible(strategy, str(exc))

    def _local(self, shape, sig, mesh) -> tuple[int, ...]:
        why = indivisible(shape, sig, mesh.shape)
        if why:
            raise _Infeasible(f"{self.name}: {why}")
        return local_shape(shape, sig, mesh.shape)

    def _redistribute(self, shape, src, dst, mesh) -> tuple[Step, ...]:
        return _plan_steps(plan(shape, self.itemsize, src, dst, mesh))

    def data_shapes(self) -> dict[str, tuple[int, ...]]:
        """Global shapes of the layer's data: inputs, weights and output gradients."""
        return {"X": self.in_shape, "dY": self.out_shape}

    def data_sigs(self, s: Strategy) -> dict[str, Signature]:
        """Where each of data_shapes lies at the start of the schedule."""
        g = self.sigs(s)
        return {"X": g.x, "dY": g.dy}

    def output_sigs(self, s: Strategy) -> dict[str, Signature]:
        """Where each output the schedule produces lies at its end (dX only where it computes input gradients)."""
        g = self.sigs(s)
        return {"Y": g.y, "dX": g.dx}


@dataclass(frozen=True)
class Linear(Layer):
    m: int = 1
    k: int = 1
    n: int = 1

    CHOICES = ("m", "n", "k", "-")
    WEIGHTED = True
    PERMUTABLE_INPUT = frozenset({1})     # X's columns meet W's rows

    @property
    def in_shape(self):
        return (self.m, self.k)

    @property
    def out_shape(self):
        return (self.m, self.n)

    def sigs(self, s: Strategy) -> Sigs:
        return Sigs(_per_axis(s.choices, {"m": Split(0), "n": B, "k": Split(1), "-": B}),
                    _per_axis(s.choices, {"m": Split(0), "n": Split(1), "k": P, "-": B}),
                    _per_axis(s.choices, {"m": Split(0), "n": Split(1), "k": B, "-": B}),
                    _per_axis(s.choices, {"m": Split(0), "n": P, "k": Split(1), "-": B}))

    def data_shapes(self):
        return {"X": self.in_shape, "W": (self.k, self.n), "dY": self.out_shape}

    def data_sigs(self, s):
        return {**super().data_sigs(s), "W": self.weight_sigs(s)[1]}

    def output_sigs(self, s):
        return {**super().output_sigs(s), "dW": self.weight_sigs(s)[1]}

    def weight_sigs(self, s: Strategy) -> tuple[Signature, Signature, Signature]:
        """(used in compute, stored, gradient produced)."""
        used = _per_axis(s.choices, {"m": B, "n": Split(1), "k": Split(0), "-": B})
        stored = tuple(Split(0) if (s.sharded_weights and p == B) else p for p in used)
        return used, stored, _per_axis(s.choices, {"m": P, "n": Split(1), "k": Split(0), "-": B})

    def _schedule(self, s, mesh, need_dx):
        g = self.sigs(s)
        used, stored, dw = self.weight_sigs(s)
        wshape = (self.k, self.n)
        xl, wl = self._local(self.in_shape, g.x, mesh), self._local(wshape, used, mesh)
        yl, wsl = self._local(self.out_shape, g.y, mesh), self._local(wshape, stored, mesh)
        gather = self._redistribute(wshape, stored, used, mesh)
        flops = 2.0 * xl[0] * xl[1] * wl[1]
        fwd = gather + (Compute("Y = X @ W", (xl, wl), yl, flops, kernels.linear_forward),)
        bwd = gather
        if need_dx:
            bwd += (Compute("dX = dY @ W.T", (yl, wl[::-1]), xl, flops, kernels.linear_input_grad),)
        bwd += (Compute("dW = X.T @ dY", (xl[::-1], yl), wl, flops, kernels.linear_weight_grad),)
        bwd += self._redistribute(wshape, dw, stored, mesh)
        isz = self.itemsize
        mem = isz * ((2 + OPTIMIZER_STATES) * math.prod(wsl) + (math.prod(wl) if s.sharded_weights else 0)
                     + math.prod(xl) + math.prod(yl))
        return Schedule(s, fwd, bwd, mem)


@dataclass(frozen=True)
class Attention(Layer):
    batch: int = 1
    seq: int = 1
    heads: int = 1
    head_dim: int = 1

    CHOICES = ("b", "h", "-")

    @property
    def in_shape(self):
        return (self.batch * self.seq, 3 * self.heads * self.head_dim)

    @property
    def out_shape(self):
        return (self.batch * self.seq, self.heads * self.head_dim)

    def sigs(self, s: Strategy) -> Sigs:
        sig = _per_axis(s.choices, {"b": Split(0), "h": Split(1), "-": B})
        return Sigs(sig, sig, sig, sig)

    def _schedule(self, s, mesh, need_dx):
        g = self.sigs(s)
        xl = self._local(self.in_shape, g.x, mesh)
        yl = self._local(self.out_shape, g.y, mesh)
        seqs, heads = self._local((self.batch, self.heads), g.x, mesh)   # whole sequences and heads
        bh, S, d = seqs * heads, self.seq, self.head_dim
        f = 2.0 * bh * S * S * d
        fwd = (Compute("A = softmax(Q @ K.T)", ((bh, S, d), (bh, d, S)), (bh, S, S), f,
                       partial(kernels.attention_forward_scores, S, d)),
               Compute("Y = A @ V", ((bh, S, S), (bh, S, d)), (bh, S, d), f, kernels.attention_forward_output))
        bwd = (Compute("dA = dY @ V.T; dV = A.T @ dY", ((bh, S, d), (bh, d, S)), (bh, S, S), 2 * f,
                       partial(kernels.attention_grad_values, S, d)),
               Compute("dQ = dS @ K; dK = dS.T @ Q", ((bh, S, S), (bh, S, d)), (bh, S, d), 2 * f,
                       partial(kernels.attention_grad_inputs, d))) if need_dx else ()
        mem = self.itemsize * (math.prod(xl) + math.prod(yl))    # scores recomputed (flash-attention style)
        return Schedule(s, fwd, bwd, mem)


@dataclass(frozen=True)
class Elementwise(Layer):
    rows: int = 1
    cols: int = 1
    op: str = "gelu"

    CHOICES = ("r", "c", "-")

    @property
    def in_shape(self):
        return (self.rows, self.cols)

    out_shape = in_shape

    def sigs(self, s: Strategy) -> Sigs:
        sig = _per_axis(s.choices, {"r": Split(0), "c": Split(1), "-": B})
        return Sigs(sig, sig, sig, sig)

    def _schedule(self, s, mesh, need_dx):
        xl = self._local(self.in_shape, self.sigs(s).x, mesh)
        fwd = (Compute(f"Y = {self.op}(X)", (xl,), xl, 0.0, partial(kernels.activation_forward, self.op)),)
        bwd = (Compute(f"dX = dY * {self.op}'(X)", (xl, xl), xl, 0.0, partial(kernels.activation_grad, self.op)),
               ) if need_dx else ()
        return Schedule(s, fwd, bwd, self.itemsize * 2 * math.prod(xl))


@dataclass(frozen=True)
class Embedding(Layer):
    vocab: int = 1
    dim: int = 1
    tokens: int = 1
    density: float = 1.0      # share of the table's rows one rank's tokens touch

    CHOICES = ("dar", "dag", "r", "c", "-")

    @property
    def in_shape(self):
        return (self.tokens, 1)

    @property
    def out_shape(self):
        return (self.tokens, self.dim)

    def sigs(self, s: Strategy) -> Sigs:
        y = _per_axis(s.choices, {"dar": Split(0), "dag": Split(0), "r": Split(0), "c": Split(1), "-": B})
        x = tuple(Split(0) if p == Split(0) else B for p in y)
        return Sigs(x, y, y, x)

    def table_sig(self, s: Strategy) -> Signature:
        """The table's placement (and its gradient's): rows split for r, columns for c, else replicated."""
        return _per_axis(s.choices, {"dar": B, "dag": B, "r": Split(0), "c": Split(1), "-": B})

    def data_shapes(self):
        return {"W": (self.vocab, self.dim), "dY": self.out_shape}

    def data_sigs(self, s):
        return {"W": self.table_sig(s), "dY": self.sigs(s).dy}

    def output_sigs(self, s):
        return {"Y": self.sigs(s).y, "dW": self.table_sig(s)}

    def _schedule(self, s, mesh, need_dx):
        """Gradient exchanges are Steps on the table gradient [vocab, dim] (allreduce: dense P->B; allgather:
        the touched rows plus their int64 indices, sparse); r's alltoall Steps carry the looked-up rows
        [tokens, dim] to and from the table's owners, forward and backward."""
        g = self.sigs(s)
        table = self.table_sig(s)
        tl = self._local((self.vocab, self.dim), table, mesh)
        yl = self._local(self.out_shape, g.y, mesh)
        # traffic: a lookup reads only the rows it gathers; the gradient is a zero-filled table into whose
        # touched rows dY is added (read and written)
        moves, exchanges = [], []
        density = self.density
        for axis, c in enumerate(s.choices):
            grp = mesh.axes[axis]
            if grp.size == 1 or c in ("c", "-"):
                continue
            rows_b = math.prod(yl) * self.itemsize
            if c == "r":
                moves.append(Step(axis, "alltoall", g.y, g.y, 0, 0, grp.size, grp.link, yl, yl, rows_b, rows_b))
                continue
            src = table[:axis] + (P,) + table[axis + 1:]
            if c == "dar":
                nbytes = math.prod(tl) * self.itemsize
                exchanges.append(Step(axis, "allreduce", src, table, None, None, grp.size, grp.link, tl, tl, nbytes,
                                      nbytes))
            else:
                rows = max(1, round(min(1.0, density) * tl[0]))
                nbytes = rows * (tl[1] * self.itemsize + 8)
                exchanges.append(Step(axis, "allgather", src, table, 0, None, grp.size, grp.link, (rows, tl[1]),
                                      (rows * grp.size, tl[1]), nbytes, nbytes * grp.size))
                density = min(1.0, density * grp.size)
        fwd = (Compute("Y = W[ids]", (yl,), yl, 0.0, kernels.embedding_lookup), *moves)
        bwd = (*moves[::-1], Compute("dW[ids] += dY", (yl, yl), tl, 0.0, kernels.embedding_grad), *exchanges)
        mem = self.itemsize * ((2 + OPTIMIZER_STATES) * math.prod(tl) + math.prod(yl))
        return Schedule(s, fwd, bwd, mem)
