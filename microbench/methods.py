"""Timing methods: commcal's own (the default) and the reference modes that reproduce a peer's table
(`sweep --method osu|osu-window|imb|nccl-tests`). Pure: no MPI here; the driver runs the loops.

commcal: every call after a barrier, timed on every rank, max over ranks per call, median with a CI, cold buffers.
A reference mode times as the peer does, with warm buffers (one pair reused), and each of its samples is one of
the peer's loops (its figure: the loop's mean time per call), combined over ranks as the peer combines them:

- osu (OSU Micro-Benchmarks 7.5): osu_latency times each round trip back to back on rank 0 (no barrier) and
  reports half their mean; a collective times each call, then a barrier (outside the timed region), and reports
  each rank's mean averaged over ranks. MPI_CHAR data (MPI_INT for reductions). Sizes of allgather and alltoall are per rank.
- osu-window (osu_bw): 64 messages in flight from rank 0, then a 1-byte acknowledgement; the time per message.
- imb (IMB-MPI1 2021.11): a collective times each call, then a barrier (IMB's default -sync 1), and reports the
  slowest rank's mean (t_max, the column `commcal import` keeps); PingPong times the loop back to back after a
  barrier (half the round trip). MPI_BYTE data, MPI_FLOAT for reductions. Sizes of allgather and alltoall are
  per rank; reduce_scatter calls MPI_Reduce_scatter as OSU's does.
- nccl-tests: a back-to-back loop of 20 calls after 5 warm-up calls, its time / 20 averaged over ranks; sizes
  and algbw/busbw already follow nccl-tests in commcal (float32).

The peer's loop is shortened (never below MIN_LOOP calls) where min_samples loops would not fit the point's
budget: a loop's mean is the peer's statistic at any length once warm, and the CI needs several loops."""

from __future__ import annotations

from dataclasses import dataclass

from microbench.errors import UsageError
from microbench.ops import COMM_DTYPE

REDUCTIONS = ("allreduce", "reduce", "reduce_scatter")

STYLE_EACH, STYLE_EACH_BARRIER, STYLE_LOOP = 0, 1, 2
"""timeloop.c's commcal_peer styles: each call timed back to back; each call timed, a barrier after it; the whole
loop timed after one barrier."""
CODE_REDUCE_SCATTER, CODE_WINDOW = 8, 9
"""timeloop.c's extra calls: MPI_Reduce_scatter with equal counts (OSU's and IMB's), osu_bw's window."""
WINDOW = 64
"""osu_bw's messages in flight per window."""
MIN_LOOP = 8


@dataclass(frozen=True)
class Method:
    name: str
    peer: str                         # "commcal", "osu", "imb", "nccl-tests"
    combine: str                      # over ranks: "max", "mean" or "rank0" (of each call for commcal, else of loop means)
    per_rank_ops: tuple[str, ...] = ()  # operations whose size is one rank's block (commcal's: the whole buffer)
    statistic: str = ""

    @property
    def reference(self) -> bool:
        return self.name != "commcal"

    def commcal_bytes(self, op: str, size: int, procs: int) -> int:
        """The size in commcal's (nccl-tests) convention for a size in this method's convention."""
        return size * procs if op in self.per_rank_ops else size

    def dtype(self, op: str) -> str:
        """The element type the peer sends: OSU MPI_INT for reductions, else MPI_CHAR; IMB MPI_FLOAT for reductions,
        else MPI_BYTE (each binary's '# Datatype' line, and IMB's table headers)."""
        if self.peer == "osu":
            return "int32" if op in REDUCTIONS else "int8"
        if self.peer == "imb":
            return "float32" if op in REDUCTIONS else "uint8"
        return COMM_DTYPE

    def style(self, op: str) -> int:
        if self.peer == "osu":
            return STYLE_LOOP if self.name == "osu-window" else (STYLE_EACH if op == "pingpong" else STYLE_EACH_BARRIER)
        if self.peer == "imb" and op != "pingpong":
            return STYLE_EACH_BARRIER
        return STYLE_LOOP

    def c_code(self, op: str, base: int) -> int:
        """timeloop.c's code for `op` (base: commcal's own, ops.py)."""
        if self.peer in ("osu", "imb") and op == "reduce_scatter":
            return CODE_REDUCE_SCATTER
        return CODE_WINDOW if self.name == "osu-window" else base

    def rank_combine(self, op: str) -> str:
        return "rank0" if op == "pingpong" else self.combine

    def loop(self, op: str, size: int) -> tuple[int, int]:
        """(the peer's timed calls per loop, its untimed warm-up calls) at `size` (the peer's convention)."""
        large = size > 8192
        if self.name == "osu-window":
            return (20, 2) if large else (100, 10)
        if self.peer == "osu":
            if op == "pingpong":
                return (1000, 10) if large else (10000, 100)
            return (100, 10) if large else (1000, 100)
        if self.peer == "imb":
            return max(1, min(1000, (40 << 20) // max(size, 1))), 2
        if self.peer == "nccl-tests":
            return 20, 5
        return 0, 0

    def loop_length(self, op: str, size: int, per_call_s: float, budget_s: float, min_samples: int) -> int:
        """The peer's loop, shortened so that min_samples loops fit the budget (at least MIN_LOOP calls)."""
        want, _ = self.loop(op, size)
        fits = int(budget_s / max(min_samples, 1) / max(per_call_s, 1e-9))
        return max(min(want, MIN_LOOP), min(want, fits))


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("commcal", "commcal", "max", statistic="per call after a barrier, max over ranks, median"),
    Method("osu", "osu", "mean", ("allgather", "alltoall"), "mean of a back-to-back loop, averaged over ranks (osu_latency: rank 0, "
                                       "half the round trip)"),
    Method("osu-window", "osu", "rank0", statistic="time per message with 64 in flight (osu_bw), rank 0"),
    Method("imb", "imb", "max", ("allgather", "alltoall", "reduce_scatter"),
           "mean of per-call times with a barrier after each, slowest rank (t_max; PingPong: a back-to-back loop)"),
    Method("nccl-tests", "nccl-tests", "mean", statistic="loop time / 20, averaged over ranks"),
)}


def method_for(name: str | None, op_names=()) -> Method:
    """The method called `name` (None: commcal); osu-window times only pingpong."""
    m = METHODS.get(name or "commcal")
    if m is None:
        raise UsageError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
    if m.name == "osu-window" and set(op_names) - {"pingpong"}:
        raise UsageError("--method osu-window (osu_bw's window of messages) times only pingpong: add --ops pingpong")
    return m


def combine_ranks(per_rank, how: str):
    """Each sample's figure from a (ranks x samples) array of per-rank loop means (or per-call times for 'max')."""
    import numpy as np

    arr = np.asarray(per_rank, dtype=float)
    if how == "max":
        return arr.max(axis=0)
    if how == "rank0":
        return arr[0]
    return arr.mean(axis=0)
