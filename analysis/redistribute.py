"""Redistribution plans: how to turn a tensor sharded by one SBP signature into another, as a list of
steps the cost model prices and the validation harness executes, one step per mesh axis at a time.

A `Step` carries everything needed to run it on a device at mesh coordinate c (see sbp.local_slices):
  allreduce       P->B    sum the local buffer over the axis group.
  reduce_scatter  P->S(d) move dim `scatter_dim` to the front, cut it into group_size blocks in group
                          order, MPI Reduce_scatter_block; member i keeps the sum of block i.
  allgather       S(d)->B MPI Allgather of the local block, concatenated along `gather_dim` in group order.
  alltoall        S(i)->S(j) cut the local block along `scatter_dim` (j) into group_size blocks, send block
                          q to member q, concatenate what arrives along `gather_dim` (i) in group order.
  slice           B->S(d) local: keep block c[axis] of `scatter_dim`.                      (free)
  partial         B->P or S(d)->P  local: member c[axis]==0 keeps the data (S(d): placed at its block of
                          `gather_dim` in a zero buffer), the others zeros.                  (free)
  relabel         any, on an axis of size 1: nothing to do to the data.                        (free)
Steps are ordered so that every intermediate buffer is exactly the canonical block of the step's `dst`
signature: a split is added or removed on a dim only at the innermost axis that splits it. The one
exception is asked for by the caller: for a dim in `permutable`, an allgather may remove an outer split.
Each device then holds a canonical block of the tensor with that dim's index order permuted (the gathered
digit moves below the remaining splits), which costs nothing when the consumer contracts that dim with an
operand it stores in the same order: AutoDDL stores weight rows so, and its 3D layers pass activations on
with a reduce-scatter and an allgather alone. `Plan.permuted` names such dims. The plan is
the cheapest such sequence by bytes moved per rank (ties: fewer steps), found by Dijkstra over the
signatures and cached per (src, dst, mesh shape).

bytes_per_rank is each rank's input (send) buffer; size_bytes is the nccl-tests size the calibration
prices: allreduce the buffer, allgather the gathered output (bytes_per_rank * group), reduce_scatter and
alltoall the whole send buffer."""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass
from functools import cached_property, lru_cache

from analysis.mesh import Mesh
from analysis.sbp import B, P, Signature, Split, fmt, indivisible, local_shape, splitters

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "alltoall")


@dataclass(frozen=True)
class Step:
    axis: int
    op: str                      # a collective from microbench.ops, or "slice" / "partial" (local, free)
    src: Signature
    dst: Signature
    gather_dim: int | None
    scatter_dim: int | None
    group_size: int
    link: str                    # intra | inter | spread (mesh.AxisGroup.link)
    in_shape: tuple[int, ...]    # local shape before
    out_shape: tuple[int, ...]   # local shape after
    bytes_per_rank: int
    size_bytes: int
    permutes: bool = False       # an allgather of an outer split (see the module doc)

    @property
    def is_comm(self) -> bool:
        return self.op in COLLECTIVES

    @property
    def sparse(self) -> bool:
        """A partial sum exchanged as an allgather: touched rows and their indices (layers.Embedding)."""
        return self.op == "allgather" and self.src[self.axis] == P

    @cached_property
    def copies(self) -> tuple[int, ...]:
        """Elements of each local layout copy that executing the step makes (analysis.harness_exec): blocks cut
        or joined along a dim other than the outermost, a slice of an inner dim, a partial's zero-filled output;
        a sparse exchange packs its rows, unpacks what arrives, and adds it in (read, gather and scatter)."""
        outer = lambda dim: dim in (None, 0)  # noqa: E731
        n_in, n_out = math.prod(self.in_shape), math.prod(self.out_shape)
        if self.sparse:
            return (n_in, n_out, n_out, n_out)
        cut = self.op in ("reduce_scatter", "alltoall") and not outer(self.scatter_dim)
        join = self.op in ("allgather", "alltoall") and not outer(self.gather_dim)
        local = ((self.op == "slice" and not outer(self.scatter_dim))
                 or (self.op == "partial" and self.gather_dim is not None))
        return (n_in,) * cut + (n_out,) * (join or local)

    def describe(self) -> str:
        what = f"{self.op} on axis {self.axis} ({self.link}, {self.group_size} ranks)"
        if self.permutes:
            what += f", permuting dim {self.gather_dim if self.op == 'allgather' else self.scatter_dim}"
        return f"{fmt(self.src)} -> {fmt(self.dst)}: {what}, {self.bytes_per_rank} B per rank"


@dataclass(frozen=True)
class Plan:
    """steps from src to dst; feasible False (cost infinite) with `reason` when it cannot be done."""

    shape: tuple[int, ...]
    itemsize: int
    src: Signature
    dst: Signature
    steps: tuple[Step, ...]
    feasible: bool = True
    reason: str = ""

    @property
    def comm_steps(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.is_comm)

    @property
    def permuted(self) -> tuple[int, ...]:
        """Tensor dims whose index order the plan permutes."""
        return tuple(sorted({s.gather_dim if s.op == "allgather" else s.scatter_dim for s in self.steps if s.permutes}))


def volume(op: str, p: int) -> float:
    """Bytes one rank sends per byte of its input buffer under a bandwidth-optimal algorithm, on average over the
    group (the route metric; a rooted bcast or reduce moves its buffer to or from each of the p - 1 others)."""
    return {"allreduce": 2 * (p - 1) / p, "reduce_scatter": (p - 1) / p, "allgather": p - 1.0,
            "alltoall": (p - 1) / p, "bcast": (p - 1) / p, "reduce": (p - 1) / p}.get(op, 0.0)


def _moves(sig: Signature, axis: int, ndim: int, permutable: frozenset[int]):
    """(op, new placement, gather_dim, scatter_dim) legal from `sig` on `axis`."""
    cur = sig[axis]
    innermost = lambda d: all(a < axis for a in splitters(sig, d))  # noqa: E731 - may add a split here
    if cur.is_split:
        if splitters(sig, cur.dim)[-1] != axis:
            if cur.dim in permutable:
                yield "allgather*", B, cur.dim, None
            return
        yield "allgather", B, cur.dim, None
        yield "partial", P, cur.dim, None
        for d in range(ndim):
            if d != cur.dim and innermost(d):
                yield "alltoall", Split(d), cur.dim, d
    elif cur == B:
        yield "partial", P, None, None
        for d in range(ndim):
            if innermost(d):
                yield "slice", Split(d), None, d
    else:
        yield "allreduce", B, None, None
        for d in range(ndim):
            if innermost(d):
                yield "reduce_scatter", Split(d), None, d


@lru_cache(maxsize=64)
def _graph(mesh_shape: tuple[int, ...], ndim: int, permutable: frozenset[int]) -> dict:
    """Every signature on the mesh -> [(cost, next signature, (axis, op, gather_dim, scatter_dim))]."""
    placements = [B, P, *(Split(d) for d in range(ndim))]
    graph = {}
    for sig in itertools.product(placements, repeat=len(mesh_shape)):
        frac = 1.0 / math.prod(n for n, p in zip(mesh_shape, sig) if p.is_split)
        edges = []
        for axis in range(len(sig)):
            if mesh_shape[axis] == 1:
                moves = [("relabel", new, None, None) for new in placements if new != sig[axis]]
            else:
                moves = list(_moves(sig, axis, ndim, permutable))
            for op, new, g, s in moves:
                edges.append((frac * volume(op.rstrip("*"), mesh_shape[axis]), sig[:axis] + (new,) + sig[axis + 1:],
                              (axis, op, g, s)))
        graph[sig] = edges
    return graph


@lru_cache(maxsize=4096)
def _tree(src: Signature, mesh_shape: tuple[int, ...], ndim: int, permutable: frozenset[int]) -> dict:
    """Dijkstra from src: signature -> (previous signature, move) on a cheapest path (ties: fewer steps)."""
    graph = _graph(mesh_shape, ndim, permutable)
    best = {src: (0.0, 0)}
    prev: dict = {src: None}
    heap = [(0.0, 0, src)]
    while heap:
        cost, nsteps, sig = heapq.heappop(heap)
        if best[sig] < (cost, nsteps):
            continue
        for c, nxt, move in graph[sig]:
            key = (cost + c, nsteps + 1)
            if key < best.get(nxt, (math.inf, 0)):
                best[nxt], prev[nxt] = key, (sig, move)
                heapq.heappush(heap, (*key, nxt))
    return prev


def route(src: Signature, dst: Signature, mesh_shape: tuple[int, ...], ndim: int,
          permutable: frozenset[int] = frozenset()):
    """The cheapest legal sequence of (axis, op, src, dst, gather_dim, scatter_dim), or None; an op ending in
    "*" is an allgather that permutes its dim."""
    prev = _tree(src, mesh_shape, ndim, frozenset(permutable))
    if dst not in prev:
        return None
    path = []
    while prev[dst] is not None:
        sig, (axis, op, g, s) = prev[dst]
        path.append((axis, op, sig, dst, g, s))
        dst = sig
    return tuple(reversed(path))


def plan(shape: tuple[int, ...], itemsize: int, src: Signature, dst: Signature, mesh: Mesh,
         permutable: frozenset[int] = frozenset()) -> Plan:
    """The plan that redistributes a `shape` tensor of `itemsize`-byte elements from src to dst on mesh;
    dims in `permutable` may come out in a permuted index order (see the module doc)."""
    shape = tuple(shape)
    for sig, name in ((src, "source"), (dst, "target")):
        if len(sig) != len(mesh.shape):
            return Plan(shape, itemsize, src, dst, (), False, f"{name} {fmt(sig)} has {len(sig)} placements "
                        f"for a {len(mesh.shape)}-axis mesh")
        why = indivisible(shape, sig, mesh.shape)
        if why:
            return Plan(shape, itemsize, src, dst, (), False, why)
    path = route(src, dst, mesh.shape, len(shape), permutable)
    if path is None:
        return Plan(shape, itemsize, src, dst, (), False, f"no legal route from {fmt(src)} to {fmt(dst)}")
    return _build(shape, itemsize, src, dst, mesh, path)


def _build(shape, itemsize: int, src: Signature, dst: Signature, mesh: Mesh, path) -> Plan:
    """A Plan from route()'s moves (an op ending in "*" permutes its dim)."""
    steps = []
    for axis, move, a, b, g, s in path:
        op = move.rstrip("*")
        why = indivisible(shape, b, mesh.shape)
        if why:
            return Plan(shape, itemsize, src, dst, (), False, why)
        grp = mesh.axes[axis]
        ins, outs = local_shape(shape, a, mesh.shape), local_shape(shape, b, mesh.shape)
        nbytes = math.prod(ins) * itemsize if op in COLLECTIVES else 0
        size = nbytes * grp.size if op == "allgather" else nbytes
        steps.append(Step(axis, op, a, b, g, s, grp.size, grp.link, ins, outs, nbytes, size, move != op))
    return Plan(shape, itemsize, src, dst, tuple(steps))


def dual(sig: Signature) -> Signature:
    """A gradient's signature: B and P swap (a replicated value's gradient arrives as partial sums)."""
    return tuple(P if p == B else B if p == P else p for p in sig)


_ADJOINT = {"allreduce": "allreduce", "reduce_scatter": "allgather", "allgather": "reduce_scatter",
            "alltoall": "alltoall", "slice": "partial", "relabel": "relabel"}


def adjoint(fwd: Plan, mesh: Mesh) -> Plan:
    """The backward of a forward plan: its steps reversed and transposed, from the gradient of its target to
    the gradient of its source. It undoes whatever index order the forward permuted."""
    if not fwd.feasible:
        return Plan(fwd.shape, fwd.itemsize, dual(fwd.dst), dual(fwd.src), (), False, fwd.reason)
    path = []
    for st in reversed(fwd.steps):
        op = _ADJOINT.get(st.op) or ("slice" if st.src[st.axis].is_split else "partial")
        path.append((st.axis, op + "*" * st.permutes, dual(st.dst), dual(st.src), st.scatter_dim, st.gather_dim))
    return _build(fwd.shape, fwd.itemsize, dual(fwd.dst), dual(fwd.src), mesh, path)
