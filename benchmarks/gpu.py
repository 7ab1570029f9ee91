"""Benchmark for a GPU node: GEMM TFLOP/s per dtype, NCCL latency on one rank, host<->device copy
bandwidth. Run `python -m benchmarks.gpu` (one rank; NCCL allows one rank per GPU).
Uses the sweep's own backend and measuring functions, so the figures are what a sweep reports."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from microbench.backends import NcclBackend
from microbench.driver import measure_collective, measure_local
from microbench.ops import COMM_DTYPE, OPS, itemsize
from microbench.sizes import format_size
from microbench.stats import StopRule, estimate


def copy_bandwidth(cupy, nbytes: int, to_device: bool, iters: int = 20) -> float:
    """Median bytes/s of one pinned-host <-> device copy, timed with CUDA events."""
    host = cupy.cuda.alloc_pinned_memory(nbytes)
    dev = cupy.cuda.alloc(nbytes)
    times = []
    for _ in range(iters):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        if to_device:
            dev.copy_from_host(host.ptr, nbytes)
        else:
            dev.copy_to_host(host.ptr, nbytes)
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) * 1e-3)
    return nbytes / estimate(np.array(times)).median


def main() -> None:
    world = MPI.COMM_WORLD
    hosts = world.allgather(MPI.Get_processor_name())
    b = NcclBackend(world, hosts)
    rule = StopRule(target_ci=0.02, min_samples=10, budget_s=2.0)
    print(f"# {b.devices(world)[0]['name']}  versions {b.versions()}")
    for dtype in b.dtypes(OPS["gemm"]):
        for n in (4096, 8192):
            lay = OPS["gemm"].layout(n * n * itemsize(dtype), 1, itemsize(dtype))
            m = measure_local(OPS["gemm"], lay, dtype, rule, b)
            print(f"gemm {dtype:<9} n={n:<5} {m.flops / m.estimate.median / 1e12:8.1f} TFLOP/s  wrong={m.wrong}")
    timer, _ = b.make_timer(world, "auto")
    for name in ("allreduce", "bcast"):
        for size in (8, 1 << 20, 64 << 20):
            lay = OPS[name].layout(size, world.size, itemsize(COMM_DTYPE))
            m = measure_collective(OPS[name], world, lay, COMM_DTYPE, rule, timer, b)
            print(f"nccl {name:<9} p={world.size} {format_size(size):>5}  median {m.estimate.median * 1e6:9.2f} us  "
                  f"wrong={m.wrong}")
    for to_device, label in ((True, "host->device"), (False, "device->host")):
        print(f"copy {label} 256M pinned: {copy_bandwidth(b.cupy, 256 << 20, to_device) / 1e9:6.1f} GB/s")


if __name__ == "__main__":
    main()
