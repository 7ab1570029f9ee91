"""Colossal-AI's tensor-parallel linear layers (Bian et al. 2021; Xu et al. 2021 for 2D, Wang et al. 2021 for 2.5D,
Agarwal et al. 1995 and Bian et al. 2021 for 3D) as strategies of a Linear layer Y[m,n] = X[m,k] W[k,n], each with
its real communication schedule: every broadcast, reduction, allgather and reduce-scatter, in order, on the mesh
axes that form its grid (a strategy is offered only on a mesh of its grid's shape, so each collective has a mesh
axis and that axis's link class). Pure: analysis.harness_exec runs these very entries.

  cai-1d-col  mesh p: Megatron's column layer. X replicated, W and Y split by columns; backward allreduces dX.
  cai-1d-row  mesh p: Megatron's row layer. X split by columns, W by rows; forward allreduces the partial Y.
  cai-2d      mesh q x q (axis 0: grid row i, axis 1: grid column j): SUMMA. X, W, Y are q x q blocks, device (i,j)
              holding block (i,j). Forward, for t < q: the row broadcast of X(i,t) (axis 1, from member t), the
              column broadcast of W(t,j) (axis 0, from member t), Y(i,j) += X(i,t) W(t,j). Backward (Colossal-AI's
              Matmul_ABT and Matmul_ATB): for t < q, the column broadcast of W(t,j), dY(i,j) W(t,j)^T reduced along
              the row to member t: dX(i,t); then for t < q, the row broadcast of X(i,t), X(i,t)^T dY(i,j) reduced
              along the column to member t: dW(t,j).
  cai-2.5d    mesh d x q x q (axis 0: depth h, d >= 2): d SUMMA layers on axes 1 and 2. X and Y rows split over
              (h, i), columns over j; W is q x q blocks replicated over depth, so each layer's dW is a partial sum
              over its rows of the batch and is allreduced over depth at the end.
  cai-3d      mesh q x q x q (axes I, J, L): device (i,j,l) multiplies X(i,l) by W(l,j), a partial of Y(i,j) over l.
              X rows split over (I, J), columns over L; W stored rows over (L, I), columns over J; Y rows over (I, L),
              columns over J. Forward: allgather X over J, allgather W over I, one local product, reduce-scatter Y
              over L; backward: allgather dY over L, dX reduce-scattered over J, dW reduce-scattered over I. The
              stored W rows are in AutoDDL's permuted order (block l*q + i on device (i, j, l), see `stored_order`)
              so that its allgather over the outer axis I yields the contiguous W(l,j).

Strategy ids are "cai-" + the kind. `words_moved` counts what a schedule moves over all ranks under
bandwidth-optimal collectives (analysis.redistribute.volume)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import numpy as np

from analysis import kernels
from analysis.layers import OPTIMIZER_STATES, Compute, Linear, Schedule, Sigs, Strategy
from analysis.mesh import Mesh
from analysis.redistribute import adjoint, plan, volume
from analysis.sbp import B, P, Signature, Split, indivisible, local_shape

KINDS = ("1d-col", "1d-row", "2d", "2.5d", "3d")
PREFIX = "cai-"
ROOTED = ("bcast", "reduce")
"""The collectives of a grid schedule beyond those of redistribution plans (analysis.redistribute.COLLECTIVES)."""


@dataclass(frozen=True)
class Grid:
    """A Colossal-AI strategy of a linear layer; `kind` is one of KINDS."""

    kind: str

    @property
    def id(self) -> str:
        return PREFIX + self.kind


@dataclass(frozen=True)
class Framed:
    """The SBP strategy `sbp` run from and to a grid strategy's placements (its input, output and gradients
    redistributed by the cheapest plans, its weight stored as the grid stores it, in natural row order): the same
    computation, so that the two can be compared in communication (`framed`)."""

    sbp: Strategy
    grid: Grid

    @property
    def id(self) -> str:
        return f"{self.sbp.id}@{self.grid.id}"


def fits(kind: str, shape: tuple[int, ...]) -> bool:
    """Whether a mesh of `shape` is the kind's grid: p; q x q; d x q x q with d >= 2; q x q x q."""
    if kind.startswith("1d"):
        return len(shape) == 1
    if kind == "2d":
        return len(shape) == 2 and shape[0] == shape[1]
    if kind == "2.5d":
        return len(shape) == 3 and shape[1] == shape[2] and shape[0] >= 2
    return len(shape) == 3 and shape[0] == shape[1] == shape[2]


def strategies(layer: Linear, mesh: Mesh) -> list:
    """The grid strategies the mesh admits, each followed by its SBP equivalent (`framed`) where it has one."""
    out = []
    for g in (Grid(k) for k in KINDS if fits(k, mesh.shape)):
        twin = framed(layer, g, mesh)
        out += [g, twin.strategy] if twin else [g]
    return out


S0, S1 = Split(0), Split(1)
_SIGS = {  # x, y (= dy), dx, the weight as stored (= its gradient)
    "1d-col": ((B,), (S1,), (B,), (S1,)),
    "1d-row": ((S1,), (B,), (S1,), (S0,)),
    "2d": ((S0, S1), (S0, S1), (S0, S1), (S0, S1)),
    "2.5d": ((S0, S0, S1), (S0, S0, S1), (S0, S0, S1), (B, S0, S1)),
    "3d": ((S0, S0, S1), (S0, S1, S0), (S0, S0, S1), (S0, S1, S0)),
}


def _grid(s: Grid | Framed) -> Grid:
    return s.grid if isinstance(s, Framed) else s


def sigs(s: Grid | Framed) -> Sigs:
    x, y, dx, _ = _SIGS[_grid(s).kind]
    return Sigs(x, y, y, dx)


def weight_sig(s: Grid | Framed) -> Signature:
    """Where the stored weight and its gradient lie (rows in `stored_order`)."""
    return _SIGS[_grid(s).kind][3]


def stored_order(g: Grid | Framed, w: np.ndarray, mesh_shape: tuple[int, ...]) -> np.ndarray:
    """The weight (or its gradient) with its rows in the order the strategy stores them: cai-3d swaps the two
    digits of the row block index (k/q^2 rows a block), so that device (i, j, l) holds block l*q + i; the others
    keep the natural order. The swap is its own inverse."""
    if not isinstance(g, Grid) or g.kind != "3d":
        return w
    q = mesh_shape[0]
    k = w.shape[0]
    return w.reshape(q, q, k // q ** 2, *w.shape[1:]).swapaxes(0, 1).reshape(w.shape)


@dataclass(frozen=True)
class Rooted:
    """A broadcast (from member `root`) or a reduction (to member `root`) of one block on a mesh axis's groups,
    all groups at once; priced like any collective by its op's model at the axis's link class (the nccl-tests
    size of bcast and reduce is the whole buffer)."""

    op: str                       # one of ROOTED
    axis: int
    root: int
    group_size: int
    link: str
    shape: tuple[int, ...]
    bytes_per_rank: int
    what: str

    is_comm = True
    copies = ()

    @property
    def size_bytes(self) -> int:
        return self.bytes_per_rank

    def describe(self) -> str:
        way = "from" if self.op == "bcast" else "to"
        return (f"{self.op} of {self.what} {way} member {self.root} on axis {self.axis} ({self.link}, "
                f"{self.group_size} ranks), {self.bytes_per_rank} B per rank")


@dataclass(frozen=True)
class GridSchedule(Schedule):
    """A Schedule with, per entry of `steps`, the buffers it reads and writes (src, dst; None for a Compute)."""

    buffers: tuple = ()


def _infeasible(g: Grid | Framed, reason: str) -> GridSchedule:
    return GridSchedule(g, feasible=False, reason=reason, memory_bytes=math.inf)


def schedule(layer: Linear, g: Grid, mesh: Mesh, need_dx: bool = True) -> GridSchedule:
    """The strategy's forward and backward entries on `mesh` (infeasible where the mesh is not its grid or a dim
    does not divide)."""
    if not fits(g.kind, mesh.shape):
        return _infeasible(g, f"{g.id} needs a mesh of its grid's shape, not {'x'.join(map(str, mesh.shape))}")
    s = sigs(g)
    wshape = (layer.k, layer.n)
    for shape, sig in ((layer.in_shape, s.x), (layer.out_shape, s.y), (wshape, weight_sig(g))):
        why = indivisible(shape, sig, mesh.shape)
        if why:
            return _infeasible(g, f"{layer.name}: {why}")
    build = {"1d-col": _column, "1d-row": _row, "2d": _summa, "2.5d": _summa, "3d": _cube}[g.kind]
    fwd, bwd, extra = build(layer, g, mesh, need_dx)
    isz = layer.itemsize
    held = [local_shape(shape, sig, mesh.shape) for shape, sig in ((layer.in_shape, s.x), (layer.out_shape, s.y))]
    wl = math.prod(local_shape(wshape, weight_sig(g), mesh.shape))
    mem = isz * ((2 + OPTIMIZER_STATES) * wl + sum(map(math.prod, held)) + extra)
    return GridSchedule(g, tuple(e for e, _ in fwd), tuple(e for e, _ in bwd), mem,
                        buffers=tuple(b for _, b in fwd + bwd))


def _product(expr: str, a: tuple, b: tuple, out: tuple, kernel) -> tuple:
    """(Compute of out = a @ b on local shapes, no buffers)."""
    return Compute(expr, (a, b), out, 2.0 * a[0] * a[1] * b[1], kernel), None


def _steps(p, src: str, dst: str) -> list:
    if not p.feasible:
        raise ValueError(p.reason)
    return [(st, (src, dst)) for st in p.steps]


def _column(layer: Linear, g: Grid, mesh: Mesh, need_dx: bool):
    m, k, n, p = layer.m, layer.k, layer.n, mesh.shape[0]
    fwd = [_product("Y = X @ W", (m, k), (k, n // p), (m, n // p), kernels.linear_forward)]
    bwd = []
    if need_dx:
        bwd += [_product("dX = dY @ W.T", (m, n // p), (n // p, k), (m, k), kernels.linear_input_grad),
                *_steps(plan(layer.in_shape, layer.itemsize, (P,), (B,), mesh), "dX", "dX")]
    bwd.append(_product("dW = X.T @ dY", (k, m), (m, n // p), (k, n // p), kernels.linear_weight_grad))
    return fwd, bwd, 0


def _row(layer: Linear, g: Grid, mesh: Mesh, need_dx: bool):
    m, k, n, p = layer.m, layer.k, layer.n, mesh.shape[0]
    fwd = [_product("Y = X @ W", (m, k // p), (k // p, n), (m, n), kernels.linear_forward),
           *_steps(plan(layer.out_shape, layer.itemsize, (P,), (B,), mesh), "Y", "Y")]
    bwd = [_product("dX = dY @ W.T", (m, n), (n, k // p), (m, k // p), kernels.linear_input_grad)] if need_dx else []
    bwd.append(_product("dW = X.T @ dY", (k // p, m), (m, n), (k // p, n), kernels.linear_weight_grad))
    return fwd, bwd, 0


def _summa(layer: Linear, g: Grid, mesh: Mesh, need_dx: bool):
    """SUMMA on the last two mesh axes (rows of the grid: the last axis's groups; columns: the one before); on a
    d x q x q mesh each depth runs its own, and dW is allreduced over depth."""
    row, col = len(mesh.shape) - 1, len(mesh.shape) - 2
    q, isz = mesh.shape[row], layer.itemsize
    s = sigs(g)
    xl, yl = local_shape(layer.in_shape, s.x, mesh.shape), local_shape(layer.out_shape, s.y, mesh.shape)
    wl = local_shape((layer.k, layer.n), weight_sig(g), mesh.shape)

    def rooted(op, axis, t, shape, what, src, dst):
        grp = mesh.axes[axis]
        return Rooted(op, axis, t, grp.size, grp.link, shape, math.prod(shape) * isz, what), (src, dst)

    def block(out, a, b, ta, tb, acc):
        return partial(kernels.block_product, out, a, b, ta, tb, acc)

    fwd, bwd = [], []
    for t in range(q):
        fwd += [rooted("bcast", row, t, xl, f"X(i,{t})", "X", "Xt"), rooted("bcast", col, t, wl, f"W({t},j)", "W", "Wt"),
                _product("Y += Xt @ Wt" if t else "Y = Xt @ Wt", xl, wl, yl, block("Y", "Xt", "Wt", False, False, t > 0))]
    if need_dx:
        for t in range(q):
            bwd += [rooted("bcast", col, t, wl, f"W({t},j)", "W", "Wt"),
                    _product("dXt = dY @ Wt.T", yl, wl[::-1], xl, block("dXt", "dY", "Wt", False, True, False)),
                    rooted("reduce", row, t, xl, f"dX(i,{t})", "dXt", "dX")]
    for t in range(q):
        bwd += [rooted("bcast", row, t, xl, f"X(i,{t})", "X", "Xt"),
                _product("dWt = Xt.T @ dY", xl[::-1], yl, wl, block("dWt", "Xt", "dY", True, False, False)),
                rooted("reduce", col, t, wl, f"dW({t},j)", "dWt", "dW")]
    if len(mesh.shape) == 3:
        stored = weight_sig(g)
        bwd += _steps(plan((layer.k, layer.n), isz, (P,) + stored[1:], stored, mesh), "dW", "dW")
    return fwd, bwd, math.prod(xl) + math.prod(wl)


def _cube(layer: Linear, g: Grid, mesh: Mesh, need_dx: bool):
    isz, s, stored = layer.itemsize, sigs(g), weight_sig(g)
    wshape = (layer.k, layer.n)
    gx = plan(layer.in_shape, isz, s.x, (S0, B, S1), mesh)
    gw = plan(wshape, isz, stored, (B, S1, S0), mesh, frozenset({0}))
    ry = plan(layer.out_shape, isz, (S0, S1, P), s.y, mesh)
    xl, wl = gx.steps[-1].out_shape, gw.steps[-1].out_shape
    yl = ry.steps[0].in_shape
    fwd = [*_steps(gx, "X", "X"), *_steps(gw, "W", "W"),
           _product("Y = X @ W", xl, wl, yl, kernels.linear_forward), *_steps(ry, "Y", "Y")]
    bwd = _steps(adjoint(ry, mesh), "dY", "dY")
    if need_dx:
        bwd += [_product("dX = dY @ W.T", yl, wl[::-1], xl, kernels.linear_input_grad),
                *_steps(adjoint(gx, mesh), "dX", "dX")]
    bwd += [_product("dW = X.T @ dY", xl[::-1], yl, wl, kernels.linear_weight_grad),
            *_steps(adjoint(gw, mesh), "dW", "dW")]
    return fwd, bwd, math.prod(xl) + math.prod(wl)


def words_moved(steps, mesh: Mesh, itemsize: int) -> float:
    """Elements the schedule's collectives move over all ranks, by bandwidth-optimal algorithms: each rank's
    buffer times the op's volume (analysis.redistribute.volume), summed over the mesh's devices."""
    return sum(volume(st.op, st.group_size) * st.bytes_per_rank for st in steps if st.is_comm) * mesh.devices / itemsize


def framed(layer: Linear, g: Grid, mesh: Mesh, need_dx: bool = True) -> GridSchedule | None:
    """The schedule of the SBP strategy that computes what `g` computes from and to the same placements, with the
    same flops per device (not replicating the products), and moves the fewest words (ties: the first in the
    layer's order); None where no SBP strategy stores the weight as `g` does or the grid does not fit."""
    if not fits(g.kind, mesh.shape):
        return None
    work = _flops(schedule(layer, g, mesh, need_dx))
    found = [framed_schedule(layer, Framed(s, g), mesh, need_dx) for s in layer.strategies(mesh)
             if layer.weight_sigs(s)[1] == weight_sig(g)]
    found = [sc for sc in found if sc.feasible and _flops(sc) <= work]
    return min(found, key=lambda sc: words_moved(sc.steps, mesh, layer.itemsize), default=None)


def framed_schedule(layer: Linear, f: Framed, mesh: Mesh, need_dx: bool = True) -> GridSchedule:
    """f's SBP schedule between its grid's placements: the input (and output gradient) redistributed to the SBP
    strategy's placements, its own schedule, its output (and input gradient) redistributed back."""
    inner = layer.schedule(f.sbp, mesh, need_dx)
    if not inner.feasible:
        return _infeasible(f, inner.reason)
    want, have, isz = sigs(f), layer.sigs(f.sbp), layer.itemsize
    edges = [plan(layer.in_shape, isz, want.x, have.x, mesh), plan(layer.out_shape, isz, have.y, want.y, mesh),
             plan(layer.out_shape, isz, want.dy, have.dy, mesh), plan(layer.in_shape, isz, have.dx, want.dx, mesh)]
    bad = next((e.reason for e in edges if not e.feasible), None)
    if bad:
        return _infeasible(f, bad)
    fwd = [*_steps(edges[0], "X", "X"), *_weight_phase(inner.forward), *_steps(edges[1], "Y", "Y")]
    bwd = [*_steps(edges[2], "dY", "dY"), *_weight_phase(inner.backward),
           *(_steps(edges[3], "dX", "dX") if need_dx else [])]
    return GridSchedule(f, tuple(e for e, _ in fwd), tuple(e for e, _ in bwd), inner.memory_bytes,
                        buffers=tuple(b for _, b in fwd + bwd))


def _flops(sched: Schedule) -> float:
    return sum(e.flops for e in sched.steps if isinstance(e, Compute))


def _weight_phase(phase) -> list:
    """An SBP linear phase's entries with their buffers: the stored weight (Wst) gathered into W before the first
    product, the weight gradient redistributed in place after the last (as analysis.harness_exec runs them)."""
    first = next(i for i, e in enumerate(phase) if isinstance(e, Compute))
    last = max(i for i, e in enumerate(phase) if isinstance(e, Compute))
    return ([(e, ("Wst" if i == 0 else "W", "W")) for i, e in enumerate(phase[:first])]
            + [(e, None) for e in phase[first:last + 1]] + [(e, ("dW", "dW")) for e in phase[last + 1:]])
