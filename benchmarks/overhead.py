"""Benchmark: how close commcal's reported medians come to a plain C loop timing the same calls.

Run on 2 ranks: `mpirun -n 2 --oversubscribe --bind-to none python -m benchmarks.overhead`.
Each round measures, side by side in one job, ping-pong and allreduce with the sweep's own
measuring function (compiled path and Python path) and with ref_loop.c; it prints per-round
medians and the median ratio to the C reference (target: within 20% at 8 B, 2% at >= 64 KiB); the
"C repeat" row times the reference loop a second time, so its ratio shows the machine's noise floor.
The "cold" rows time the sweep's default, cold buffers (a 64 MiB pool of copies the calls rotate through),
with the compiled path and with the C reference rotating through the very same slots, so "cold" against
"C cold" is the default method's overhead over a C loop timing the same way (issue 33: within 1.10x at 8 B).
It also compares 4 MiB ping-pong with and without huge pages for numpy buffers."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from microbench.threads import choose

THREADS = choose(None)   # the level a sweep asks for (single, or MPI4PY_RC_THREAD_LEVEL), before MPI starts
from mpi4py import MPI  # noqa: E402

from microbench import cloop
from microbench.backends import MpiBackend
from microbench.driver import PythonTimer, make_timer, measure_collective
from microbench.ops import COMM_DTYPE, OPS, itemsize
from microbench.stats import StopRule, estimate
from microbench.buffers import Pool, Slots, address, set_page_policy
from benchmarks import benchmark_parser

REF_SOURCE = Path(__file__).with_name("ref_loop.c")


def load_reference(world: MPI.Comm):
    path = None
    if world.rank == 0:
        mpicc = cloop.find_mpicc()
        path = cloop.library_path(mpicc, MPI.Get_library_version(), REF_SOURCE)
        err = cloop.build(mpicc, path, REF_SOURCE)
        if err:
            raise SystemExit(f"cannot build the reference loop: {err}")
    path = world.bcast(path, root=0)
    fn = ctypes.CDLL(str(path)).ref_time_slots
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_long,
                   ctypes.c_long, ctypes.c_long, ctypes.POINTER(ctypes.c_double)]
    return fn


def reference_median(fn, comm: MPI.Comm, which: int, nbytes: int, iters: int, slots: Slots | None = None) -> float:
    """The C loop's median of per-call maxima over ranks: on its own warm pair, or rotating through `slots`."""
    out = np.empty(iters)
    pool, count, stride, recv_at = None, 1, 0, 0
    if slots is not None and slots.count > 1:
        pool = address(slots.pool) + slots.send_at
        count, stride, recv_at = slots.count, slots.stride, slots.recv_at - slots.send_at
    fn(which, comm.py2f(), nbytes, iters, pool, count, stride, recv_at,
       out.ctypes.data_as(ctypes.POINTER(ctypes.c_double)))
    comm.Allreduce(MPI.IN_PLACE, out, op=MPI.MAX)
    return estimate(out).median


def main() -> None:
    ap = benchmark_parser("benchmarks.overhead", __doc__)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--sizes", default="8,65536,1048576")
    args = ap.parse_args()
    world = MPI.COMM_WORLD
    if world.size != 2:
        raise SystemExit("run on exactly 2 ranks")
    ref = load_reference(world)
    host = MpiBackend(world, [])
    set_page_policy("nohugepage")
    compiled, note = make_timer(world, "c")
    timers = {"compiled": compiled, "python": PythonTimer()}
    rule = StopRule(target_ci=0.02, min_samples=10, budget_s=1.0)
    sizes = [int(s) for s in args.sizes.split(",")]
    ratios: dict[tuple[str, int, str], list[float]] = {}
    pool = Pool(np)
    medians: dict[tuple[str, int, str], list[float]] = {}
    for rnd in range(args.rounds):
        for which, name in enumerate(("pingpong", "allreduce")):
            op = OPS[name]
            for size in sizes:
                lay = op.layout(size, 2, itemsize(COMM_DTYPE))
                iters = max(100, min(20000, int(2e7 // max(size, 8))))
                c_ref = reference_median(ref, world, which, lay.size_bytes, iters)
                medians.setdefault((name, size, "C reference"), []).append(c_ref)
                for label, timer in timers.items():
                    m = measure_collective(op, world, lay, COMM_DTYPE, rule, timer, host)
                    medians.setdefault((name, size, label), []).append(m.estimate.median)
                    ratios.setdefault((name, size, label), []).append(m.estimate.median / c_ref)
                # the same C loop again: its ratio to the first is this machine's noise floor
                again = reference_median(ref, world, which, lay.size_bytes, iters)
                medians.setdefault((name, size, "C repeat"), []).append(again)
                ratios.setdefault((name, size, "C repeat"), []).append(again / c_ref)
                # cold buffers: the default method and the C loop on the same slots of one pool
                slots = pool.slots(*op.fill(np, lay, COMM_DTYPE, world.rank, world.size))
                c_cold = reference_median(ref, world, which, lay.size_bytes, iters, slots)
                m = measure_collective(op, world, lay, COMM_DTYPE, rule, compiled, host, pool=pool)
                medians.setdefault((name, size, "C cold"), []).append(c_cold)
                medians.setdefault((name, size, "cold"), []).append(m.estimate.median)
                ratios.setdefault((name, size, "cold"), []).append(m.estimate.median / c_cold)
    if world.rank == 0:
        level = MPI.Query_thread()
        library = MPI.Get_library_version().rstrip(chr(0)).splitlines()[0]
        print(f"# {library}; timing: {note}; {args.rounds} rounds; MPI thread "
              f"level {THREADS['requested']} requested, {level} provided (0 single .. 3 multiple)")
        print("# ratios: warm paths to the C reference, cold to C cold (the same slots of one 64 MiB pool)")
        print(f"{'op':<10} {'size':>8} {'path':<12} {'median us':>10} {'ratio to C (median of rounds)':>30}")
        for (name, size, label), vals in sorted(medians.items()):
            r = ratios.get((name, size, label))
            ratio = f"{np.median(r):.3f}  [{min(r):.3f}..{max(r):.3f}]" if r else "1 (a reference)"
            print(f"{name:<10} {size:>8} {label:<12} {np.median(vals) * 1e6:>10.3f} {ratio:>30}")
    pages = {}
    for policy in ("nohugepage", "hugepage"):
        set_page_policy(policy)
        lay = OPS["pingpong"].layout(4 << 20, 2, itemsize(COMM_DTYPE))
        pages[policy] = [measure_collective(OPS["pingpong"], world, lay, COMM_DTYPE, rule, compiled,
                                            host).estimate.median for _ in range(3)]
    if world.rank == 0:
        print("4 MiB ping-pong by page policy (median of 3 points, us): " +
              ", ".join(f"{k} {np.median(v) * 1e6:.1f}" for k, v in pages.items()))


if __name__ == "__main__":
    main()
