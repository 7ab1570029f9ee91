"""The registry: one definition per measured operation (size semantics, bus-bandwidth factor,
buffer blocks, expected result, how to call it; for an operation on one rank's memory, its kernel and
check; the element types it is measured in). The driver owns all timing; nothing here times.

Pure at import: mpi4py is imported only when an operation is called, so calib and analysis may
read bus factors. Buffers come from an array module `xp` (numpy, or cupy for GPU backends).
Send buffers hold small integers so that float sums are exact and results compare elementwise."""

from __future__ import annotations

import math
from dataclasses import dataclass
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
    block: int           # elements per rank's block; = send_count for unblocked operations
    itemsize: int

    @property
    def buffer_bytes(self) -> int:
        return (self.send_count + self.recv_count) * self.itemsize


def pattern(xp: Any, rank: int, count: int, dtype: str):
    """Rank r's send data: (i mod 7) + r + 1."""
    return ((xp.arange(count) % 7) + rank + 1).astype(dtype)


def sum_pattern(xp: Any, procs: int, count: int, dtype: str):
    """The elementwise sum of every rank's pattern."""
    return ((xp.arange(count) % 7) * procs + procs * (procs + 1) // 2).astype(dtype)


def _alltoall_send(xp: Any, rank: int, count: int, block: int, procs: int, dtype: str):
    """Block j of rank r carries r's pattern plus 8j, so a receiver can tell every block's origin."""
    return (pattern(xp, rank, count, dtype) + 8 * xp.repeat(xp.arange(procs), block)).astype(dtype)


COMM_DTYPE = "float32"


@dataclass(frozen=True)
class Local:
    """One local operation set up on its operands: `fetch(i)` gives its i-th iteration's arrays (views of slot i of
    the buffers, made outside the timed call as a collective's are: on a GPU each view costs microseconds),
    `run(arrays)` runs it on them, `check()` counts the wrong elements of iteration 0's result (after it ran and
    the device synchronised)."""

    fetch: Callable[[int], Any]
    run: Callable[[Any], None]
    check: Callable[[], int]
    flops: float = 0.0


@dataclass(frozen=True)
class Op:
    name: str
    kind: str                                   # "collective", "p2p" or "compute"
    size_meaning: str                           # what size_bytes is (nccl-tests conventions)
    bus_factor: Callable[[int], float]          # busbw = algbw * bus_factor(p)
    call: Callable[..., None] | None = None     # call(comm, send, recv, MPI): one invocation via mpi4py
    expected: Callable[..., Any] | None = None  # expected(xp, lay, dtype, rank, p) -> result or None
    send_blocks: bool = False                   # send buffer holds p per-rank blocks
    recv_blocks: bool = False                   # receive buffer holds p per-rank blocks
    c_code: int = -1                            # case in timeloop.c; -1: no compiled path
    result_in_send: bool = False                # result lands in the send buffer (bcast)
    send: Callable[..., Any] = lambda xp, rank, count, block, procs, dtype: pattern(xp, rank, count, dtype)
    in_place: Callable[..., tuple] | None = None  # (send, recv, rank, block) -> in-place (send, recv) views
    time_scale: float = 1.0                     # reported time = one call's time * this (pingpong: half the round trip)
    local: Callable[..., Local] | None = None   # compute: local(xp, lay, dtype, slots) -> Local; slots(a, b) -> Slots
    dtypes: tuple[str, ...] = (COMM_DTYPE,)     # element types measured with host buffers
    device_dtypes: tuple[str, ...] | None = None  # those tried on a GPU backend (None: dtypes)

    def layout(self, requested_bytes: int, procs: int, itemsize: int) -> Layout:
        """Round the element count so every rank's block is whole (at least one element per block); a local
        operand's side of 64 or more rounds down to a multiple of 64, as model dimensions are (odd sides are
        slow), and a smaller one to an even number (the copy halves it)."""
        if self.kind == "compute":
            n = math.isqrt(max(1, requested_bytes // itemsize))
            n = n - n % 64 if n >= 64 else max(2, n - n % 2)
            return Layout(requested_bytes, n * n * itemsize, n * n, n * n, n, itemsize)
        elements = max(1, requested_bytes // itemsize)
        if not (self.send_blocks or self.recv_blocks):
            return Layout(requested_bytes, elements * itemsize, elements, elements, elements, itemsize)
        block = max(1, elements // procs)
        send = block * procs if self.send_blocks else block
        recv = block * procs if self.recv_blocks else block
        return Layout(requested_bytes, block * procs * itemsize, send, recv, block, itemsize)

    def granule(self, procs: int, itemsize: int) -> int:
        """The step between the sizes this operation measures at procs ranks: an element, or a block for every rank."""
        return itemsize * (procs if self.send_blocks or self.recv_blocks else 1)

    def bytes_per_rank(self, size_bytes: int, procs: int) -> float:
        """What an optimal algorithm sends per rank: size * bus factor."""
        return size_bytes * self.bus_factor(procs)

    def fill(self, xp: Any, lay: Layout, dtype: str, rank: int, procs: int, in_place: bool = False):
        """Fresh send and receive buffers for this rank (sharing memory when in place)."""
        send, recv = self.send(xp, rank, lay.send_count, lay.block, procs, dtype), xp.zeros(lay.recv_count, dtype=dtype)
        return self.in_place(send, recv, rank, lay.block) if in_place else (send, recv)

    def result(self, send, recv):
        """The buffer that `expected` describes."""
        return send if self.result_in_send else recv

    def invoke(self, comm: Any, send, recv) -> None:
        from mpi4py import MPI

        self.call(comm, send, recv, MPI)


def _pingpong(comm, send, recv, MPI) -> None:
    if comm.rank == 0:
        comm.Send(send, dest=1, tag=7)
        comm.Recv(recv, source=1, tag=7)
    else:
        comm.Recv(recv, source=0, tag=7)
        comm.Send(send, dest=0, tag=7)


def _sendrecv(comm, send, recv, MPI) -> None:
    peer = 1 - comm.rank
    comm.Sendrecv(send, dest=peer, sendtag=9, recvbuf=recv, source=peer, recvtag=9)


def _copy_into(dst, src):
    dst[...] = src
    return dst


def _host(arr: Any) -> np.ndarray:
    return arr.get() if hasattr(arr, "get") else arr


def _operand(xp: Any, n: int, dtype: str, rng: np.random.Generator):
    return xp.asarray(rng.standard_normal((n, n)).astype(numpy_dtype(dtype)))


def _gemm(xp: Any, lay: Layout, dtype: str, slots: Callable[[Any, Any], Any]) -> Local:
    """Local n x n matrix multiply on standard-normal operands: low-entropy data such as zeros or small integers
    runs faster on tensor cores than real data does. Sampled entries are checked against a float64 product of the
    same (rounded) operands. Iterations take their operands and product from `slots` (cold copies, or one pair)."""
    n = lay.block
    rng = np.random.default_rng(0)
    ab = xp.stack([_operand(xp, n, dtype, rng), _operand(xp, n, dtype, rng)])
    pairs = slots(ab, xp.zeros((n, n), dtype=ab.dtype))

    def fetch(i: int) -> tuple:
        operands, c = pairs.pair(i)
        return operands[0], operands[1], c

    def product(arrays: tuple) -> None:
        a, b, c = arrays
        xp.matmul(a, b, out=c)

    def check() -> int:
        rows, cols = rng.integers(0, n, 16), rng.integers(0, n, 16)
        a64, b64, c_host = (np.asarray(_host(m), dtype=np.float64) for m in (ab[0], ab[1], pairs.pair(0)[1]))
        return gemm_wrong(a64[rows, :], b64[:, cols], c_host[rows, cols], n, dtype)
    return Local(fetch, product, check, gemm_flops(n))


def _copy(xp: Any, lay: Layout, dtype: str, slots: Callable[[Any, Any], Any]) -> Local:
    """Local copy of an n x n operand into its two column halves, the copy that the validation harness makes
    around a collective whose split is not the outer dimension. With cold `slots`, iterations find source and
    destination out of cache, as the harness's copies find theirs (a cold copy takes several times as long as one
    back to back: docs/results.md, "Cold and warm buffers")."""
    n = lay.block
    src = _operand(xp, n, dtype, np.random.default_rng(0))
    pairs = slots(src, xp.zeros((2, n, n // 2), dtype=src.dtype))

    def halves(arrays: tuple) -> None:
        s, d = arrays
        xp.copyto(d, xp.moveaxis(s.reshape(n, 2, n // 2), 1, 0))

    def check() -> int:
        got, want = _host(pairs.pair(0)[1]), _host(src)
        return int((got[0] != want[:, :n // 2]).sum() + (got[1] != want[:, n // 2:]).sum())
    return Local(pairs.pair, halves, check)


def compute_phase(backend: Any, n: int) -> Callable[[], None]:
    """An n x n float32 GEMM on this rank's device, finished when it returns: the compute that precedes each
    collective of a training step (sweep --after-gemm)."""
    xp = backend.xp
    rng = np.random.default_rng(1)
    a, b = _operand(xp, n, "float32", rng), _operand(xp, n, "float32", rng)
    c = xp.empty_like(a)

    def run() -> None:
        xp.matmul(a, b, out=c)
        backend.sync()
    return run


def _ring(p: int) -> float:
    return (p - 1) / p


def _one(p: int) -> float:
    return 1.0


OPS: dict[str, Op] = {op.name: op for op in (
    Op("allreduce", "collective", "whole buffer on every rank", lambda p: 2 * (p - 1) / p,
       call=lambda c, s, r, MPI: c.Allreduce(s, r, op=MPI.SUM),
       expected=lambda xp, lay, dt, rank, p: sum_pattern(xp, p, lay.send_count, dt), c_code=0,
       in_place=lambda s, r, rank, b: (_copy_into(r, s), r)),
    Op("allgather", "collective", "whole gathered (receive) buffer", _ring,
       call=lambda c, s, r, MPI: c.Allgather(s, r),
       expected=lambda xp, lay, dt, rank, p: xp.concatenate([pattern(xp, q, lay.block, dt) for q in range(p)]),
       recv_blocks=True, c_code=1,
       in_place=lambda s, r, rank, b: (_copy_into(r[rank * b:(rank + 1) * b], s), r)),
    Op("reduce_scatter", "collective", "whole send buffer (p blocks)", _ring,
       call=lambda c, s, r, MPI: c.Reduce_scatter_block(s, r, op=MPI.SUM),
       expected=lambda xp, lay, dt, rank, p: sum_pattern(xp, p, lay.send_count, dt)[rank * lay.block:(rank + 1) * lay.block],
       send_blocks=True, c_code=2,
       in_place=lambda s, r, rank, b: (s, s[rank * b:(rank + 1) * b])),
    Op("alltoall", "collective", "whole send buffer (p blocks)", _ring,
       call=lambda c, s, r, MPI: c.Alltoall(s, r),
       expected=lambda xp, lay, dt, rank, p: xp.concatenate(
           [_alltoall_send(xp, q, lay.send_count, lay.block, p, dt)[rank * lay.block:(rank + 1) * lay.block] for q in range(p)]),
       send=_alltoall_send, send_blocks=True, recv_blocks=True, c_code=3),
    Op("bcast", "collective", "whole buffer (root 0)", _one,
       call=lambda c, s, r, MPI: c.Bcast(s, root=0),
       expected=lambda xp, lay, dt, rank, p: pattern(xp, 0, lay.send_count, dt),
       send=lambda xp, rank, count, block, p, dt: pattern(xp, 0, count, dt) if rank == 0 else xp.zeros(count, dtype=dt),
       result_in_send=True, c_code=4),
    Op("reduce", "collective", "whole buffer (root 0)", _one,
       call=lambda c, s, r, MPI: c.Reduce(s, r, op=MPI.SUM, root=0),
       expected=lambda xp, lay, dt, rank, p: sum_pattern(xp, p, lay.send_count, dt) if rank == 0 else None, c_code=5),
    Op("pingpong", "p2p", "message; time is half the round trip", _one, call=_pingpong,
       expected=lambda xp, lay, dt, rank, p: pattern(xp, 1 - rank, lay.send_count, dt), c_code=6, time_scale=0.5),
    Op("sendrecv", "p2p", "message in each direction, both ranks at once", _one, call=_sendrecv,
       expected=lambda xp, lay, dt, rank, p: pattern(xp, 1 - rank, lay.send_count, dt), c_code=7),
    Op("gemm", "compute", "one square operand (n x n); rate = 2 n^3 / time", _one, local=_gemm,
       dtypes=("float32", "float64"), device_dtypes=("float32", "float16", "bfloat16")),
    Op("copy", "compute", "one square operand (n x n) copied into its two column halves, the layout change around "
       "a collective; busbw = bytes read + written / time", lambda p: 2.0, local=_copy),
)}

LOCAL_OPS = tuple(name for name, op in OPS.items() if op.kind == "compute")
"""Operations on one rank's memory (no link class): the calibration's compute section, not its models."""

def parse_ops(text: str | None) -> list[Op]:
    """'allreduce,pingpong' -> their definitions, in registry order; None -> all; an empty list or item is an error
    (an unset shell variable must not mean every operation)."""
    if text is None:
        return list(OPS.values())
    names = [t.strip() for t in text.split(",")]
    if not all(names):
        raise UsageError(f"empty operation in the list {text!r}; choose from {', '.join(OPS)}")
    unknown = [n for n in names if n not in OPS]
    if unknown:
        raise UsageError(f"unknown operation {', '.join(map(repr, unknown))}; choose from {', '.join(OPS)}")
    return [op for op in OPS.values() if op.name in names]


def gemm_flops(n: int) -> float:
    return 2.0 * n ** 3


GEMM_UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


def gemm_wrong(a64: np.ndarray, b64: np.ndarray, c: np.ndarray, n: int, dtype: str) -> int:
    """Sampled product entries outside the rounding bound (u_out + n u_acc) * sum |a||b|: the output's
    rounding plus a float32 (float64) accumulation over n terms. A misplaced term is far outside it."""
    want = np.einsum("ij,ji->i", a64, b64)
    scale = np.einsum("ij,ji->i", np.abs(a64), np.abs(b64))
    u_acc = GEMM_UNIT_ROUNDOFF["float64" if dtype == "float64" else "float32"]
    bound = (GEMM_UNIT_ROUNDOFF[dtype] + n * u_acc) * scale
    return int((~(np.abs(c - want) <= bound)).sum())


def numpy_dtype(name: str):
    """numpy dtype for a name; bfloat16 comes from ml_dtypes (installed with the GPU extra)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def itemsize(dtype: str) -> int:
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize


def known_dtype(dtype) -> bool:
    """Whether `dtype` names an element type itemsize knows."""
    try:
        return isinstance(dtype, str) and itemsize(dtype) > 0
    except TypeError:
        return False
