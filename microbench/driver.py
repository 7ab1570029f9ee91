"""The one timing driver: every operation is measured here, the same way.

Per point: an untimed check iteration, warm-up, then batches of timed iterations (barrier
outside the timed region, each iteration timed on every rank, combined by max over ranks) until
the stopping rule says done, then a second check iteration. Runs under MPI."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from microbench import cloop, methods
from microbench.buffers import Pool, Slots, address, page_aligned
from microbench.ops import Layout, Op
from microbench.stats import Estimate, StopRule, estimate, sample_until_done

MPI_DTYPES = {"float32": MPI.FLOAT, "float64": MPI.DOUBLE, "int8": MPI.CHAR, "uint8": MPI.BYTE,
              "int32": MPI.INT}
"""What each element type is sent as: int8 as MPI_CHAR (OSU's type), uint8 as MPI_BYTE (IMB's)."""


class PythonTimer:
    """Times calls from a Python loop through mpi4py (the fallback path)."""

    path = "python"

    def run(self, op: Op, comm: MPI.Comm, slots: Slots, first: int, lay: Layout, dtype: str,
            iters: int, gap: float = 0.0, bar: MPI.Comm | None = None) -> np.ndarray:
        out = np.empty(iters)
        barrier, wtime, call = (comm if bar is None else bar).Barrier, MPI.Wtime, op.invoke
        for i in range(iters):
            send, recv = slots.pair(first + i)
            if gap > 0:
                time.sleep(gap)
            barrier()
            t0 = wtime()
            call(comm, send, recv)
            out[i] = wtime() - t0
        return out

    def peer(self, op: Op, code: int, comm: MPI.Comm, send, recv, lay: Layout, dtype: str, iters: int,
             style: int) -> float:
        """This rank's timed seconds of a peer's loop (timeloop.c's commcal_peer, through mpi4py)."""
        call = _peer_call(op, code, comm, lay)
        wtime, total = MPI.Wtime, 0.0
        if style == methods.STYLE_LOOP:
            comm.Barrier()
            t0 = wtime()
            for _ in range(iters):
                call(send, recv)
            return wtime() - t0
        for _ in range(iters):
            t0 = wtime()
            call(send, recv)
            total += wtime() - t0
            if style == methods.STYLE_EACH_BARRIER:
                comm.Barrier()
        return total


def _peer_call(op: Op, code: int, comm: MPI.Comm, lay: Layout) -> Callable[[Any, Any], None]:
    """One call as timeloop.c's code makes it: 8, MPI_Reduce_scatter with equal counts; 9, osu_bw's window."""
    if code == methods.CODE_REDUCE_SCATTER:
        counts = [lay.block] * comm.size
        return lambda s, r: comm.Reduce_scatter(s, r, recvcounts=counts, op=MPI.SUM)
    if code == methods.CODE_WINDOW:
        ack = np.zeros(1, dtype=np.int8)

        def window(s, r) -> None:
            if comm.rank == 0:
                MPI.Request.Waitall([comm.Isend(s, dest=1, tag=100) for _ in range(methods.WINDOW)])
                comm.Recv(ack, source=1, tag=101)
            else:
                MPI.Request.Waitall([comm.Irecv(r, source=0, tag=100) for _ in range(methods.WINDOW)])
                comm.Send(ack, dest=0, tag=101)
        return window
    return lambda s, r: op.invoke(comm, s, r)


class CompiledTimer:
    """Times calls from the compiled loop of timeloop.c, driven through the communicator's handle."""

    path = "c"

    def __init__(self, fn, peer_fn=None) -> None:
        self._fn, self._peer = fn, peer_fn

    def run(self, op: Op, comm: MPI.Comm, slots: Slots, first: int, lay: Layout, dtype: str,
            iters: int, gap: float = 0.0, bar: MPI.Comm | None = None) -> np.ndarray:
        out = np.empty(iters)
        barrier = comm if bar is None else bar
        rc = self._fn(op.c_code, comm.py2f(), address(slots.send), address(slots.recv), lay.send_count, lay.block,
                      MPI_DTYPES[dtype].py2f(), MPI.SUM.py2f(), iters, first, slots.count, slots.stride, gap,
                      barrier.py2f(), out.ctypes.data_as(cloop.ctypes.POINTER(cloop.ctypes.c_double)))
        if rc != 0:
            raise RuntimeError(f"MPI error {rc} in the compiled loop ({op.name})")
        return out

    def peer(self, op: Op, code: int, comm: MPI.Comm, send, recv, lay: Layout, dtype: str, iters: int,
             style: int) -> float:
        out = cloop.ctypes.c_double(0.0)
        rc = self._peer(code, comm.py2f(), address(send), address(recv), lay.send_count, lay.block,
                        MPI_DTYPES[dtype].py2f(), MPI.SUM.py2f(), iters, style, cloop.ctypes.byref(out))
        if rc != 0:
            raise RuntimeError(f"MPI error {rc} in the compiled peer loop ({op.name})")
        return out.value


def make_timer(world: MPI.Comm, choice: str) -> tuple[Any, str]:
    """The timer for `choice` ('auto', 'c' or 'python') and a note on why. Rank 0 builds the
    library once; every rank agrees on the path (a failed load anywhere means Python everywhere)."""
    if choice == "python":
        return PythonTimer(), "python loop requested"
    note = None
    if world.rank == 0:
        mpicc = cloop.find_mpicc()
        if mpicc is None:
            note = "no MPI compiler wrapper (mpicc) found"
        else:
            path = cloop.library_path(mpicc, MPI.Get_library_version())
            note = cloop.build(mpicc, path) or str(path)
    note = world.bcast(note, root=0)
    timer, ok = None, note.endswith(".so")
    if ok:
        try:
            timer = CompiledTimer(cloop.load(cloop.Path(note)), cloop.load_peer(cloop.Path(note)))
        except OSError as exc:
            ok, note = False, f"load failed: {exc}"
    all_ok = world.allreduce(int(ok), op=MPI.MIN) == 1
    if all_ok:
        return timer, f"compiled loop {note}"
    if choice == "c":
        raise RuntimeError(f"compiled timing loop unavailable: {note}")
    return PythonTimer(), f"python loop (compiled loop unavailable: {note})"


@dataclass(frozen=True)
class Measurement:
    samples: np.ndarray      # seconds per iteration, max over ranks
    estimate: Estimate
    wrong: int
    flops: float = 0.0
    in_place: bool = False
    loop: int = 0            # a reference mode's calls per loop (each sample is one loop's mean); 0: commcal's


def _count_wrong(op: Op, backend: Any, comm: MPI.Comm, lay: Layout, dtype: str, in_place: bool) -> int:
    xp = backend.xp
    send, recv = op.fill(xp, lay, dtype, comm.rank, comm.size, in_place)
    backend.invoke(op, comm, send, recv)
    want = op.expected(xp, lay, dtype, comm.rank, comm.size)
    if want is None:
        return 0
    got = op.result(send, recv)
    return int((got != want).sum())


def _sample(batch: Callable[[int], tuple[np.ndarray, float]], rule: StopRule) -> tuple[np.ndarray, Estimate]:
    """Warm up, then take batches of timed iterations until the stopping rule says done. `batch(iters)`
    returns (per-iteration seconds, wall seconds of the batch), identical on every rank in step."""
    first, _ = batch(2)                              # warm-up; its length sizes the rest of warm-up
    per_iter = max(float(first.max()), 1e-9)
    extra = int(min(20, 0.05 * rule.budget_s / per_iter))
    if extra > 0:
        batch(extra)
    samples = sample_until_done(batch, rule, per_iter)
    return samples, estimate(samples)


def measure_collective(op: Op, comm: MPI.Comm, lay: Layout, dtype: str, rule: StopRule, timer: Any,
                       backend: Any, in_place: bool = False, ctrl: MPI.Comm | None = None,
                       checks: tuple[bool, bool] = (True, True), pool: Pool | None = None,
                       gap: float = 0.0, before: Callable[[], None] | None = None) -> Measurement:
    """Measure one operation at one layout on `comm` (every member calls this). `ctrl` spans every group
    measured at once (default: comm alone): iteration times are the max over all of them, and since every
    rank then sees the same numbers, all groups take the same stopping decisions and stay in step.
    `checks` says whether to check the result before and after timing (a point timed in several visits
    checks before its first and after its last). With a `pool`, iterations rotate through cold buffers; with
    a `gap`, each iteration's barrier follows that many seconds idle."""
    ctrl = comm if ctrl is None else ctrl
    wrong = _count_wrong(op, backend, comm, lay, dtype, in_place) if checks[0] else 0
    send, recv = op.fill(backend.xp, lay, dtype, comm.rank, comm.size, in_place)
    slots = pool.slots(send, recv, in_place) if pool is not None else Slots(send, recv)
    backend.sync()
    scale = op.time_scale
    turn = 0

    def batch(iters: int) -> tuple[np.ndarray, float]:
        nonlocal turn
        t0 = time.perf_counter()
        if before is None:
            local = timer.run(op, comm, slots, turn, lay, dtype, iters, gap)
        else:
            local = np.empty(iters)
            for i in range(iters):
                ctrl.Barrier()
                before()
                local[i] = timer.run(op, comm, slots, turn + i, lay, dtype, 1, gap, ctrl)[0]
        turn += iters
        buf = np.append(local, time.perf_counter() - t0)
        ctrl.Allreduce(MPI.IN_PLACE, buf, op=MPI.MAX)
        return buf[:-1] * scale, float(buf[-1])

    samples, est = _sample(batch, rule)
    if checks[1]:
        wrong += _count_wrong(op, backend, comm, lay, dtype, in_place)
    wrong = ctrl.allreduce(wrong, op=MPI.SUM)
    return Measurement(samples, est, wrong, in_place=in_place)


def measure_peer(op: Op, comm: MPI.Comm, lay: Layout, dtype: str, rule: StopRule, timer: Any, backend: Any,
                 method: methods.Method, checks: tuple[bool, bool] = (True, True)) -> Measurement:
    """Measure one operation the peer's way (sweep --method): warm buffers, the peer's warm-up calls, then loops
    of back-to-back calls until the stopping rule says done. Each sample is one loop's mean seconds per call (per
    message for osu-window), combined over ranks as the peer does (methods.combine_ranks); lay.requested_bytes is
    the size in the peer's convention."""
    wrong = _count_wrong(op, backend, comm, lay, dtype, False) if checks[0] else 0
    send, recv = (page_aligned(backend.xp, a) for a in op.fill(backend.xp, lay, dtype, comm.rank, comm.size))
    backend.sync()
    code, style = method.c_code(op.name, op.c_code), method.style(op.name)
    scale = 1 / methods.WINDOW if code == methods.CODE_WINDOW else op.time_scale   # window: per message
    _, skip = method.loop(op.name, lay.requested_bytes)
    warm = max(skip, 2)
    per_call = comm.allreduce(timer.peer(op, code, comm, send, recv, lay, dtype, warm, style) / warm, op=MPI.MAX)
    iters = method.loop_length(op.name, lay.requested_bytes, per_call, rule.budget_s, rule.min_samples)
    how = method.rank_combine(op.name)

    def batch(loops: int) -> tuple[np.ndarray, float]:
        t0 = time.perf_counter()
        local = np.array([timer.peer(op, code, comm, send, recv, lay, dtype, iters, style) / iters
                          for _ in range(loops)])
        wall = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        every = np.empty((comm.size, loops))
        comm.Allgather(local, every)
        return methods.combine_ranks(every, how) * scale, wall

    samples = sample_until_done(batch, rule, per_call * iters)
    if checks[1]:
        wrong += _count_wrong(op, backend, comm, lay, dtype, False)
    wrong = comm.allreduce(wrong, op=MPI.SUM)
    return Measurement(samples, estimate(samples), wrong, loop=iters)


def _measure_local(fetch: Callable[[int], Any], run: Callable[[Any], None], sync: Callable[[], None],
                   rule: StopRule, ctrl: MPI.Comm | None, wrong: int, flops: float = 0.0) -> Measurement:
    """Time `run(fetch(i))` (the i-th iteration of one local operation; `fetch` untimed) until the rule says done.
    With `ctrl`, every rank of it runs at once (as training does), each iteration starting after a barrier as a
    collective's call and each of validate's steps do, iteration times are the max over them, and `wrong` (this
    rank's wrong elements) is summed over them. Unsynchronised, the max over ranks of the i-th iterations would pair
    calls made at different times, which on ranks that share cores prices a local operation several times slower
    than in step (docs/results.md, "GEMM and copy on every rank at once")."""
    turn = 0

    def batch(iters: int) -> tuple[np.ndarray, float]:
        nonlocal turn
        out = np.empty(iters + 1)
        start = time.perf_counter()
        for i in range(turn, turn + iters):
            arrays = fetch(i)
            if ctrl is not None:
                ctrl.Barrier()
            t0 = time.perf_counter()
            run(arrays)
            sync()
            out[i - turn] = time.perf_counter() - t0
        out[-1] = time.perf_counter() - start
        turn += iters
        if ctrl is not None:
            ctrl.Allreduce(MPI.IN_PLACE, out, op=MPI.MAX)
        return out[:-1], float(out[-1])

    samples, est = _sample(batch, rule)
    if ctrl is not None:
        wrong = ctrl.allreduce(wrong, op=MPI.SUM)
    return Measurement(samples, est, wrong, flops)


def measure_local(op: Op, lay: Layout, dtype: str, rule: StopRule, backend: Any, ctrl: MPI.Comm | None = None,
                  pool: Pool | None = None) -> Measurement:
    """Measure one operation on this rank's memory (one with a kernel in the op table) at one layout, its result
    checked after a first untimed iteration. With a `pool`, iterations rotate through cold copies of its operands
    and results, as for collectives."""
    kernel = op.local(backend.xp, lay, dtype, lambda a, b: pool.slots(a, b) if pool is not None else Slots(a, b))
    kernel.run(kernel.fetch(0))
    backend.sync()
    return _measure_local(kernel.fetch, kernel.run, backend.sync, rule, ctrl, kernel.check(), kernel.flops)
