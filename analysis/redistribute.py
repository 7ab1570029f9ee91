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
signature: a split is added or removed on a dim only at the innermost axis that splits it. The plan is
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
from functools import lru_cache

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

    @property
    def is_comm(self) -> bool:
        return self.op in COLLECTIVES

    def describe(self) -> str:
        what = f"{self.op} on axis {self.axis} ({self.link}, {self.group_size} ranks)"
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


def _volume(op: str, p: int) -> float:
    """Bytes one rank sends per byte of its input buffer (the route metric)."""
    return {"allreduce": 2 * (p - 1) / p, "reduce_scatter": (p - 1) / p, "allgather": p - 1.0,
            "alltoall": (p - 1) / p}.get(op, 0.0)


def _moves(sig: Signature, axis: int, ndim: int):
    """(op, new placement, gather_dim, scatter_dim) legal from `sig` on `axis`."""
    cur = sig[axis]
    innermost = lambda d: all(a < axis for a in splitters(sig, d))  # noqa: E731 - may add a split here
    if cur.is_split:
        if splitters(sig, cur.dim)[-1] != axis:
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
def _graph(mesh_shape: tuple[int, ...], ndim: int) -> dict:
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
                moves = list(_moves(sig, axis, ndim))
            for op, new, g, s in moves:
                edges.append((frac * _volume(op, mesh_shape[axis]), sig[:axis] + (new,) + sig[axis + 1:],
                              (axis, op, g, s)))
        graph[sig] = edges
    return graph


@lru_cache(maxsize=4096)
def _tree(src: Signature, mesh_shape: tuple[int, ...], ndim: int) -> dict:
    """Dijkstra from src: signature -> (previous signature, move) on a cheapest path (ties: fewer steps)."""
    graph = _graph(mesh_shape, ndim)
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


def route(src: Signature, dst: Signature, mesh_shape: tuple[int, ...], ndim: int):
    """The cheapest legal sequence of (axis, op, src, dst, gather_dim, scatter_dim), or None."""
    prev = _tree(src, mesh_shape, ndim)
    if dst not in prev:
        return None
    path = []
    while prev[dst] is not None:
        sig, (axis, op, g, s) = prev[dst]
        path.append((axis, op, sig, dst, g, s))
        dst = sig
    return tuple(reversed(path))


def plan(shape: tuple[int, ...], itemsize: int, src: Signature, dst: Signature, mesh: Mesh) -> Plan:
    """The plan that redistributes a `shape` tensor of `itemsize`-byte elements from src to dst on mesh."""
    shape = tuple(shape)
    for sig, name in ((src, "source"), (dst, "target")):
        if len(sig) != len(mesh.shape):
            return Plan(shape, itemsize, src, dst, (), False, f"{name} {fmt(sig)} has {len(sig)} placements "
                        f"for a {len(mesh.shape)}-axis mesh")
        why = indivisible(shape, sig, mesh.shape)
        if why:
            return Plan(shape, itemsize, src, dst, (), False, why)
    path = route(src, dst, mesh.shape, len(shape))
    if path is None:
        return Plan(shape, itemsize, src, dst, (), False, f"no legal route from {fmt(src)} to {fmt(dst)}")
    steps = []
    for axis, op, a, b, g, s in path:
        why = indivisible(shape, b, mesh.shape)
        if why:
            return Plan(shape, itemsize, src, dst, (), False, why)
        grp = mesh.axes[axis]
        ins, outs = local_shape(shape, a, mesh.shape), local_shape(shape, b, mesh.shape)
        nbytes = math.prod(ins) * itemsize if op in COLLECTIVES else 0
        size = nbytes * grp.size if op == "allgather" else nbytes
        steps.append(Step(axis, op, a, b, g, s, grp.size, grp.link, ins, outs, nbytes, size))
    return Plan(shape, itemsize, src, dst, tuple(steps))


def apply_step(sig: Signature, step: Step) -> Signature:
    """The signature after `step`: what its op does to the axis placement (symbolic execution)."""
    a = sig[step.axis]
    legal = {"allreduce": a == P, "reduce_scatter": a == P, "allgather": a.is_split, "alltoall": a.is_split,
             "slice": a == B, "partial": a != P, "relabel": step.group_size == 1}
    if not legal[step.op]:
        raise ValueError(f"{step.op} cannot act on {a} (axis {step.axis} of {fmt(sig)})")
    out = {"allreduce": B, "allgather": B, "partial": P, "relabel": step.dst[step.axis]}.get(step.op) \
        or Split(step.scatter_dim)
    return sig[:step.axis] + (out,) + sig[step.axis + 1:]
