"""Where each timed iteration finds its send and receive buffers. Warm: one pair, reused, so a loop of
back-to-back calls runs from cache. Cold: copies of the pair filling a pool larger than a CPU's last-level
cache or a GPU's L2, which iterations rotate through, so each call starts with its buffers out of cache,
as a collective between compute steps of training does (and as the validation harness measures it). Also how
the harness's freshly allocated arrays get their memory (keep_freed_memory) and pages (set_page_policy)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

CACHE_MODES = ("cold", "warm")
PAGE_POLICIES = ("hugepage", "nohugepage", "numpy-default")
POOL_BYTES = 64 << 20
ALIGN = 4096
"""Slots start on page boundaries, as large single buffers do."""


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
"""glibc's mallopt parameters."""
HEAP_BLOCK_LIMIT = 32 << 20
"""The largest block glibc's heap may serve (its cap for M_MMAP_THRESHOLD on 64-bit)."""


def keep_freed_memory() -> bool:
    """Have glibc's malloc serve blocks up to 32 MiB from its heap and keep what is freed there, as a framework's
    caching allocator does: a computation's new array then reuses pages already mapped instead of faulting in
    fresh ones (a cost per page that the sweep's long-lived buffers never pay; docs/results.md, "Page faults and the
    allocator"). False where the C library has no mallopt or refuses."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, HEAP_BLOCK_LIMIT)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


ALLOCATORS = ("cache", "system")
"""Host memory for arrays made while timing: cache (keep_freed_memory) or system (the C library's default)."""


def use_allocator(choice: str) -> str:
    """Set up the allocator `choice` (one of ALLOCATORS) asks for; what is in force ("system (no mallopt)" where cache
    cannot be had)."""
    return choice if choice == "system" or keep_freed_memory() else "system (no mallopt)"


def address(arr: Any) -> int:
    """Raw pointer of a numpy or cupy array (device pointers go to a CUDA-aware MPI as they are)."""
    data = getattr(arr, "data", None)
    return int(data.ptr) if hasattr(data, "ptr") else int(arr.ctypes.data)


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def aligned_bytes(xp: Any, nbytes: int) -> Any:
    """nbytes of uint8 starting on a page boundary."""
    raw = xp.empty(nbytes + ALIGN, dtype=xp.uint8)
    skip = -address(raw) % ALIGN
    return raw[skip:skip + nbytes]


def page_aligned(xp: Any, arr: Any) -> Any:
    """A copy of `arr` starting on a page boundary, as the peers' buffers do (OSU and IMB align theirs to the page):
    where a copy's source and destination lie modulo 4 KiB moves memcpy's speed (microbench.memcopy)."""
    out = _view(aligned_bytes(xp, max(arr.nbytes, 1)), arr, 0)
    out[...] = arr
    return out


@dataclass(frozen=True)
class Slots:
    """`count` copies of one (send, recv) pair, `stride` bytes apart in `pool`; send and recv are slot 0's
    (with one slot, the pair itself)."""

    send: Any
    recv: Any
    count: int = 1
    stride: int = 0
    pool: Any = None
    send_at: int = 0
    recv_at: int = 0

    def pair(self, i: int) -> tuple[Any, Any]:
        """Views of slot i (modulo count)."""
        if self.count == 1:
            return self.send, self.recv
        base = (i % self.count) * self.stride
        return _view(self.pool, self.send, base + self.send_at), _view(self.pool, self.recv, base + self.recv_at)


def _view(mem: Any, like: Any, at: int) -> Any:
    """An array shaped like `like` over mem's bytes from `at`."""
    return mem[at:at + like.nbytes].view(like.dtype).reshape(like.shape)


class Pool:
    """One rank's memory for cold buffers in array module `xp`: allocated at first use, reused by every point."""

    def __init__(self, xp: Any, nbytes: int = POOL_BYTES) -> None:
        self.xp, self.nbytes = xp, nbytes
        self._mem = None

    def _memory(self) -> Any:
        if self._mem is None:
            self._mem = aligned_bytes(self.xp, self.nbytes)
        return self._mem

    def slots(self, send: Any, recv: Any, in_place: bool = False) -> Slots:
        """Copies of (send, recv) filling the pool; the pair alone when two copies do not fit (a pair that
        large does not stay in cache between calls anyway). In place, one buffer holds the other."""
        if in_place:
            outer = send if send.nbytes >= recv.nbytes else recv
            parts = [(outer, 0)]
            send_at, recv_at = address(send) - address(outer), address(recv) - address(outer)
            span = outer.nbytes
        else:
            send_at, recv_at = 0, _round_up(send.nbytes, 64)
            parts = [(send, send_at), (recv, recv_at)]
            span = recv_at + recv.nbytes
        stride = _round_up(max(span, 1), ALIGN)
        count = self.nbytes // stride
        if count < 2:
            return Slots(send, recv)
        mem = self._memory()
        rows = mem[:count * stride].reshape(count, stride)
        for arr, at in parts:
            rows[:, at:at + arr.nbytes] = arr.reshape(-1).view(self.xp.uint8)
        return Slots(_view(mem, send, send_at), _view(mem, recv, recv_at), count, stride, mem, send_at, recv_at)


def set_page_policy(policy: str) -> str:
    """Apply numpy's huge-page advice for new buffers; returns what is in force."""
    import numpy as np

    setter = getattr(getattr(np, "_core", np.core).multiarray, "_set_madvise_hugepage", None)
    if setter is None:
        return "numpy-default (numpy has no switch)"
    if policy == "numpy-default":
        previous = setter(True)
        setter(previous)
        return f"numpy-default ({'hugepage' if previous else 'nohugepage'})"
    setter(policy == "hugepage")
    return policy
