"""What run.json records about where and how a sweep ran."""

from __future__ import annotations

import os
import platform
import re
import socket
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from microbench.limits import MAX_RANKS

ENV_PREFIXES = ("OMPI_", "PRTE_", "PMIX_", "UCX_", "NCCL_", "SLURM_", "MPICH_", "I_MPI_", "CUDA_", "OPENBLAS_",
                "OMP_", "MKL_", "GLIBC_")
"""Environment recorded with every run: MPI, fabric, GPU and BLAS settings, and glibc tunables (memcpy's
strategy moves every host-side copy a collective makes)."""


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def relevant_environment() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}


def transparent_hugepages() -> str:
    """The kernel's THP mode, e.g. 'madvise' (the bracketed choice in sysfs), or 'unknown'."""
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return "unknown"
    m = re.search(r"\[(\w+)\]", text)
    return m.group(1) if m else text.strip()


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_counters() -> tuple[int, ...] | None:
    """This host's CPU time since boot in clock ticks, /proc/stat's first eight "cpu" counters (user nice system
    idle iowait irq softirq steal), or None where the kernel does not give them."""
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("cpu "):
                    fields = tuple(int(x) for x in line.split()[1:9])
                    return fields if len(fields) == 8 else None
    except (OSError, ValueError):
        pass
    return None


STEAL_WARN = 0.05
"""Above this share of CPU time taken by the hypervisor while a run measured, fit warns (and search and validate
of a profile timed so): ranks that lose that much time to other tenants time collectives and kernels slower than
a quieter run then measures them (the record: docs/results.md, "CPU steal")."""


def steal_share(ticks) -> float | None:
    """The steal counter's share of elapsed cpu_counters() ticks (None when no time passed)."""
    total = int(sum(ticks))
    return int(ticks[7]) / total if total > 0 else None


def steal_fraction(before: tuple[int, ...] | None, after: tuple[int, ...] | None) -> float | None:
    """The share of this host's CPU time between two cpu_counters() readings that a hypervisor ran other
    guests instead (steal): time-sharing the timings cannot see; None when a reading is missing or no time passed."""
    if before is None or after is None:
        return None
    return steal_share([b - a for a, b in zip(before, after)])


def host_steal(comm, hosts: list[str], before: tuple[int, ...] | None) -> dict[str, float | None]:
    """Per host, steal_fraction since `before` (collective over comm; every rank gets the table). Ranks of one
    host read the same counters, so each host's first rank answers for it."""
    mine = steal_fraction(before, cpu_counters())
    out: dict[str, float | None] = {}
    for host, fraction in zip(hosts, comm.allgather(mine)):
        out.setdefault(host, fraction)
    return out


def steal_text(steal: dict[str, float | None]) -> str:
    """'node1 2.7%, node2 3.1%' ('unknown' where a host could not tell)."""
    return ", ".join(f"{h} {'unknown' if f is None else f'{100 * f:.1f}%'}" for h, f in steal.items())


def _kernel_id() -> str:
    """This kernel's boot id: one per machine, shared by network-namespace nodes on it (the host name otherwise)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return socket.gethostname()


def cpu_sharing(comm) -> dict | None:
    """Where ranks outnumber the CPUs they may run on (collective; every rank gets it): for the machine whose ranks
    most outnumber them, {"ranks": n, "cpus": c}, the union of those ranks' CPU affinities; None where every rank
    has a CPU of its own. Ranks of one kernel share its CPUs, whatever host names their namespaces give them."""
    mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    machines: dict[str, tuple[int, set]] = {}
    for kernel, cpus in comm.allgather((_kernel_id(), mine)):
        ranks, union = machines.get(kernel, (0, set()))
        machines[kernel] = (ranks + 1, union | set(cpus))
    worst = max(machines.values(), key=lambda m: m[0] / max(len(m[1]), 1))
    return {"ranks": worst[0], "cpus": len(worst[1])} if worst[0] > len(worst[1]) else None


def recorded_sharing(value) -> dict | None:
    """A cpu_sharing value as a file holds it, if it is one cpu_sharing() writes ({"ranks": n, "cpus": c} with
    n > c >= 1, both whole numbers of ranks a job can have); None for anything else."""
    if not isinstance(value, dict):
        return None
    ranks, cpus = value.get("ranks"), value.get("cpus")
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_RANKS for v in (ranks, cpus)):
        return None
    return {"ranks": ranks, "cpus": cpus} if ranks > cpus else None


SHARED_SWEEP = ("its groups were priced one at a time, and steps that keep every rank busy run slower than that; sweep "
                "with a core per rank (docs/troubleshooting.md#more-ranks-than-cores)")
"""What a sweep whose ranks outnumbered a machine's CPUs costs its calibration, for the fit's and validate's warnings."""


def sharing_text(sharing: dict) -> str:
    """cpu_sharing's finding as one warning."""
    return (f"{sharing['ranks']} ranks share {sharing['cpus']} CPU(s) of one machine: each collective then also waits "
            "for its members to be scheduled in turn, a cost that moves with what the other ranks do and that a "
            "machine with a core per rank does not have; give each rank a core of its own to calibrate or validate "
            "(docs/troubleshooting.md#more-ranks-than-cores)")


def machine_name(hosts: list[str]) -> str:
    """The cluster's name for file names: Slurm's cluster name, else the first host's name."""
    return os.environ.get("SLURM_CLUSTER_NAME") or (hosts[0] if hosts else socket.gethostname())


def mpi_library_version() -> str:
    """The MPI library's banner without the NUL (and whitespace) some libraries end it with."""
    from mpi4py import MPI

    return MPI.Get_library_version().replace("\x00", "").strip()


def software_versions() -> dict[str, str]:
    import mpi4py

    return {"python": sys.version.split()[0], "numpy": np.__version__, "mpi4py": mpi4py.__version__,
            "platform": platform.platform()}


def run_metadata(earlier: dict | None, hosts: list[str], *, mpi_library: str, mpi_standard: str, backend: str,
                 backend_versions: dict, gpus: list, page_policy: str, timing_path: str, timing_note: str,
                 options: dict) -> dict:
    """run.json for a new run, or for a resumed one (keeping its id and start, noting the resumption)."""
    from microbench.records import RUN_SCHEMA, RUN_SCHEMA_VERSION

    run_id = earlier["run_id"] if earlier else f"{now().replace(':', '')[:15]}-{hosts[0]}-{os.getpid()}"
    meta = dict(earlier or {}, schema=RUN_SCHEMA, version=RUN_SCHEMA_VERSION, run_id=run_id)
    meta.setdefault("start_time", now())
    meta["resumed_at"] = list(meta.get("resumed_at", [])) + ([now()] if earlier else [])
    meta.update(
        machine=machine_name(hosts), hosts=sorted(set(hosts)), world_size=len(hosts),
        layout=[{"rank": r, "host": h} for r, h in enumerate(hosts)],
        ranks_per_node={h: hosts.count(h) for h in dict.fromkeys(hosts)},
        mpi_library_version=mpi_library, mpi_standard_version=mpi_standard,
        versions=software_versions() | backend_versions, cpu=cpu_model(), command_line=sys.argv,
        environment=relevant_environment(), backend=backend, gpus=gpus, page_policy=page_policy,
        transparent_hugepages=transparent_hugepages(), timing_path=timing_path, timing_note=timing_note,
        end_time=None, options=options)
    return meta
