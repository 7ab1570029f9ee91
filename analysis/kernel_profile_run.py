"""The MPI part of `commcal profile`: every rank runs the same layer programs at once (a node's ranks sharing its cores
as they do in validate), timing each local kernel after a barrier, the slowest rank's time per call; rank 0 pools the
calls of each kernel (same expression, shapes and element type) and writes the profile. The programs' collectives and
halo exchanges run on Loopback, which keeps every buffer's shape without communicating: only the kernels are timed.
On a GPU backend the kernels run on the rank's device (cupy), each waited for before its clock is read."""

from __future__ import annotations

import datetime
import time

import numpy as np
from mpi4py import MPI

from analysis.harness import layer_data
from analysis.harness_exec import Runner
from analysis.kernel_profile import Kernel, KernelKey, Profile, write_profile
from analysis.layers import Compute
from microbench import provenance
from microbench.backends import backend_for
from microbench.buffers import set_page_policy, use_allocator
from microbench.topology import nodes_of


class Loopback:
    """Collectives that return buffers of the shapes the real ones would, moving nothing (a profile times the kernels
    between them, never these)."""

    sent = 0

    def __init__(self, mesh, xp=np) -> None:
        self.mesh, self.xp = mesh, xp

    def allreduce(self, buf, axis):
        return buf

    def allgather(self, buf, axis):
        return self.xp.stack([buf] * self.mesh.shape[axis])

    def reduce_scatter(self, blocks, axis):
        return blocks[0]

    def alltoall(self, blocks, axis):
        return blocks

    def shift(self, buf, axis, direction):
        return buf.copy()

    def bcast(self, buf, axis, root):
        return buf

    def reduce(self, buf, axis, root):
        return buf


def _time(progs, world: MPI.Comm, sync, samples: int, warmup: int = 2) -> tuple[list[Compute], np.ndarray]:
    """(the Compute steps of the programs, one pass after another, samples x steps seconds: each call's slowest rank,
    its device work waited for by `sync`). Every program's buffers live until the pass ends, as a network's do in
    validate."""
    steps = [it.entry for prog in progs for it in prog.items if isinstance(it.entry, Compute)]
    rows = np.empty((samples, len(steps)))
    for rep in range(warmup + samples):
        envs, col = [], 0
        for prog in progs:
            envs.append(env := dict(prog.inputs))
            for it in prog.items:
                if not isinstance(it.entry, Compute):
                    it.run(env)
                    continue
                world.Barrier()
                t0 = time.perf_counter()
                it.run(env)
                sync()
                if rep >= warmup:
                    rows[rep - warmup, col] = time.perf_counter() - t0
                col += 1
    out = np.empty_like(rows)
    world.Allreduce(rows, out, op=MPI.MAX)
    return steps, out


def main(args, work, dtype: str) -> int:
    """Profile every pass (label, [(layer, schedule, mesh), ...]) of `work` and write args.out on rank 0."""
    world = MPI.COMM_WORLD
    allocator = use_allocator(args.allocator)
    pages = set_page_policy(args.page_policy)
    hosts = world.allgather(MPI.Get_processor_name())
    per_node = max(len(n) for n in nodes_of(hosts))
    backend = backend_for(args.backend, world, hosts)
    say = print if world.rank == 0 else (lambda *a, **k: None)
    say(f"profile: {len(work)} passes, {world.size} ranks on {len(set(hosts))} host(s) ({per_node} per node) "
        f"computing at once; {args.samples} timed passes each; host allocator {allocator}, pages {pages}", flush=True)
    pooled: dict[KernelKey, list[np.ndarray]] = {}
    seed = args.seed
    counters = provenance.cpu_counters()
    for label, layers in work:
        progs = []
        for layer, sched, mesh in layers:
            runner = Runner(mesh, mesh.coord(world.rank % mesh.devices), Loopback(mesh, backend.xp), backend.xp)
            progs.append(runner.program(layer, sched, layer_data(layer, seed, dtype), dtype))
            seed += 1
        steps, rows = _time(progs, world, backend.sync, args.samples)
        for j, step in enumerate(steps):
            pooled.setdefault(KernelKey.of(step, dtype), []).append(rows[:, j])
    steal = provenance.host_steal(world, hosts, counters)
    if world.rank == 0:
        kernels = []
        for key, parts in pooled.items():
            s = np.concatenate(parts)
            med = float(np.median(s))
            q1, q3 = np.percentile(s, [25, 75])
            kernels.append(Kernel(key, med, len(s), float((q3 - q1) / med)))
        created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        write_profile(Profile(tuple(kernels), world.size, per_node, tuple(sorted(set(hosts))), created, allocator,
                              pages, args.backend, cpu_steal=tuple(steal.items())), args.out)
        say(f"profile: {len(kernels)} kernels timed; wrote {args.out}; CPU time taken by the hypervisor (steal): "
            f"{provenance.steal_text(steal)}", flush=True)
    return 0
