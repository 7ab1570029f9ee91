"""A tiny smoke test of the local cluster (no commcal needed): ranks 0 and 1 exchange messages and
rank 0 prints one JSON line with the hosts and the one-way bandwidth and latency.

    slurm/cluster.sh mpirun -n 2 --map-by node python slurm/localcluster/pingpong.py
    slurm/cluster.sh srun -N2 -n2 --mpi=pmix python slurm/localcluster/pingpong.py

Exits 2 when the world size is not the task count the launcher promised (SLURM_NTASKS), and
1 when a received buffer is wrong."""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
from mpi4py import MPI


def main() -> int:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    expected = os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS")
    if expected and int(expected) != size:
        if rank == 0:
            print(f"pingpong: world size {size} != Slurm task count {expected} (wrong --mpi?)", file=sys.stderr)
        return 2
    if size < 2:
        print("pingpong: needs 2 ranks", file=sys.stderr)
        return 2
    hosts = comm.gather(MPI.Get_processor_name(), root=0)
    nbytes = int(sys.argv[1]) if len(sys.argv) > 1 else 4 << 20
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    buf = np.full(nbytes, rank + 1, dtype=np.uint8)
    bad = 0
    times = []
    for it in range(reps + 2):
        comm.Barrier()
        t0 = time.perf_counter()
        if rank == 0:
            comm.Send(buf, dest=1, tag=it)
            comm.Recv(buf, source=1, tag=it)
        elif rank == 1:
            comm.Recv(buf, source=0, tag=it)
            bad += int(np.count_nonzero(buf != 1))
            buf[:] = 2
            comm.Send(buf, dest=0, tag=it)
        dt = time.perf_counter() - t0
        if rank == 0:
            bad += int(np.count_nonzero(buf != 2))
            buf[:] = 1
            if it >= 2:
                times.append(dt / 2)
    bad = comm.allreduce(bad)
    # latency: 8-byte messages
    small = np.zeros(1, dtype=np.uint64)
    lat = []
    for it in range(50):
        t0 = time.perf_counter()
        if rank == 0:
            comm.Send(small, dest=1); comm.Recv(small, source=1)
        elif rank == 1:
            comm.Recv(small, source=0); comm.Send(small, dest=0)
        lat.append((time.perf_counter() - t0) / 2)
    if rank == 0:
        t = float(np.median(times))
        print(json.dumps({"hosts": hosts, "size": size, "bytes": nbytes, "one_way_s": t,
                          "bandwidth_Bps": nbytes / t, "best_bandwidth_Bps": nbytes / min(times), "times_s": [round(x, 5) for x in times], "latency_s": float(np.median(lat)), "wrong": bad}),
              flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
