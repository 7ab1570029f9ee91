"""The registry: one definition per measured operation (size semantics, bus-bandwidth factor,
buffers, expected results, how to call it). The driver owns all timing; nothing here times.

Pure at import: mpi4py is imported only inside `call`, so calib/analysis may read bus factors.
Buffers come from an array module `xp` (numpy, or cupy for GPU backends)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from microbench.errors import UsageError


@dataclass(frozen=True)
class Layout:
    """Element counts one rank uses for one point, after fitting the requested size to p ranks."""

    requested_bytes: int
    size_bytes: int      # the nccl-tests "size" actually measured
    send_count: int
    recv_count: int
    block: int           # per-rank block (allgather/reduce_scatter/alltoall); = send_count otherwise
    itemsize: int

    @property
    def buffer_bytes(self) -> int:
        return (self.send_count + self.recv_count) * self.itemsize


@dataclass(frozen=True)
class Op:
    name: str
    kind: str                                  # "collective", "p2p" or "compute"
    size_meaning: str                          # what size_bytes is, per the nccl-tests conventions
    bus_factor: Callable[[int], float]         # busbw = algbw * bus_factor(p)
    blocked: bool = False                      # size is split into p per-rank blocks
    recv_scale: Callable[[int], int] = field(default=lambda p: 1)  # recv elements per send element
    c_code: int = -1                           # index in timeloop.c's switch; -1: Python only

    def layout(self, requested_bytes: int, procs: int, itemsize: int) -> Layout:
        """Round the element count so every rank's block is whole (at least one element per block)."""
        if self.kind == "compute":
            n = max(1, math.isqrt(max(1, requested_bytes // itemsize)))
            return Layout(requested_bytes, n * n * itemsize, n * n, n * n, n, itemsize)
        elements = max(1, requested_bytes // itemsize)
        if self.blocked:
            block = max(1, elements // procs)
            total = block * procs
            if self.name == "allgather":
                return Layout(requested_bytes, total * itemsize, block, total, block, itemsize)
            if self.name == "reduce_scatter":
                return Layout(requested_bytes, total * itemsize, total, block, block, itemsize)
            return Layout(requested_bytes, total * itemsize, total, total, block, itemsize)
        return Layout(requested_bytes, elements * itemsize, elements, elements, elements, itemsize)

    def bytes_per_rank(self, size_bytes: int, procs: int) -> float:
        return size_bytes * self.bus_factor(procs)

    def fill(self, xp: Any, lay: Layout, dtype: str, rank: int, procs: int):
        """Send and receive buffers; send holds small integers so float sums are exact."""
        send = _pattern(xp, rank, lay.send_count, dtype)
        if self.name == "alltoall":
            # block j carries (rank, j) so each receiver can check where every block came from
            j = xp.repeat(xp.arange(procs, dtype=dtype), lay.block)
            send = (send + 8 * j).astype(dtype)
        if self.name == "bcast" and rank != 0:
            send = xp.zeros(lay.send_count, dtype=dtype)
        recv = xp.zeros(lay.recv_count, dtype=dtype)
        return send, recv

    def expected(self, xp: Any, lay: Layout, dtype: str, rank: int, procs: int):
        """What this rank's result buffer must hold after one call; None where the rank holds no result."""
        if self.name == "allreduce" or (self.name == "reduce" and rank == 0):
            return _sum_pattern(xp, procs, lay.send_count, dtype)
        if self.name == "reduce":
            return None
        if self.name == "allgather":
            return xp.concatenate([_pattern(xp, r, lay.block, dtype) for r in range(procs)])
        if self.name == "reduce_scatter":
            total = _sum_pattern(xp, procs, lay.send_count, dtype)
            return total[rank * lay.block:(rank + 1) * lay.block]
        if self.name == "alltoall":
            blocks = [(_pattern(xp, r, lay.send_count, dtype)[rank * lay.block:(rank + 1) * lay.block] + 8 * rank)
                      for r in range(procs)]
            return xp.concatenate(blocks).astype(dtype)
        if self.name == "bcast":
            return _pattern(xp, 0, lay.send_count, dtype)
        if self.name in ("pingpong", "sendrecv"):
            return _pattern(xp, 1 - rank, lay.send_count, dtype)
        raise AssertionError(self.name)

    def result(self, send, recv):
        """The buffer `expected` describes (bcast works in place on the send buffer)."""
        return send if self.name == "bcast" else recv

    def call(self, comm: Any, send, recv) -> None:
        """One untimed-by-us invocation through mpi4py (the Python timing path and check iterations)."""
        from mpi4py import MPI

        n = self.name
        if n == "allreduce":
            comm.Allreduce(send, recv, op=MPI.SUM)
        elif n == "allgather":
            comm.Allgather(send, recv)
        elif n == "reduce_scatter":
            comm.Reduce_scatter_block(send, recv, op=MPI.SUM)
        elif n == "alltoall":
            comm.Alltoall(send, recv)
        elif n == "bcast":
            comm.Bcast(send, root=0)
        elif n == "reduce":
            comm.Reduce(send, recv, op=MPI.SUM, root=0)
        elif n == "pingpong":
            if comm.rank == 0:
                comm.Send(send, dest=1, tag=7)
                comm.Recv(recv, source=1, tag=7)
            else:
                comm.Recv(recv, source=0, tag=7)
                comm.Send(send, dest=0, tag=7)
        elif n == "sendrecv":
            peer = 1 - comm.rank
            comm.Sendrecv(send, dest=peer, sendtag=9, recvbuf=recv, source=peer, recvtag=9)
        else:
            raise AssertionError(n)


def _pattern(xp: Any, rank: int, count: int, dtype: str):
    return ((xp.arange(count) % 7) + rank + 1).astype(dtype)


def _sum_pattern(xp: Any, procs: int, count: int, dtype: str):
    return ((xp.arange(count) % 7) * procs + procs * (procs + 1) // 2).astype(dtype)


def _ring(p: int) -> float:
    return (p - 1) / p


OPS: dict[str, Op] = {op.name: op for op in (
    Op("allreduce", "collective", "whole buffer on every rank", lambda p: 2 * (p - 1) / p, c_code=0),
    Op("allgather", "collective", "whole gathered (receive) buffer", _ring, blocked=True, c_code=1),
    Op("reduce_scatter", "collective", "whole send buffer (p blocks)", _ring, blocked=True, c_code=2),
    Op("alltoall", "collective", "whole send buffer (p blocks)", _ring, blocked=True, c_code=3),
    Op("bcast", "collective", "whole buffer (root 0)", lambda p: 1.0, c_code=4),
    Op("reduce", "collective", "whole buffer (root 0)", lambda p: 1.0, c_code=5),
    Op("pingpong", "p2p", "message; time is half the round trip", lambda p: 1.0, c_code=6),
    Op("sendrecv", "p2p", "message in each direction, both ranks at once", lambda p: 1.0, c_code=7),
    Op("gemm", "compute", "one square operand (n x n); rate = 2 n^3 / time", lambda p: 1.0),
)}

COMM_DTYPE = "float32"
GEMM_DTYPES = ("float32", "float64")


def parse_ops(text: str | None) -> list[Op]:
    """'allreduce,pingpong' -> their definitions, in registry order; None -> all."""
    if not text:
        return list(OPS.values())
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in OPS]
    if unknown or not names:
        raise UsageError(f"unknown operation {', '.join(unknown) or text!r}; choose from {', '.join(OPS)}")
    return [op for op in OPS.values() if op.name in names]


def gemm_flops(n: int) -> float:
    return 2.0 * n ** 3


def itemsize(dtype: str) -> int:
    return np.dtype(dtype).itemsize
