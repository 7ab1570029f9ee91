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


CGROUP_ROOT = Path("/sys/fs/cgroup")


def _quota_file(directory: Path, v2: bool) -> float | None:
    """The CPUs one cgroup directory's quota allows (cgroup v2 cpu.max, v1 cpu.cfs_quota_us over cpu.cfs_period_us);
    None where it sets none or cannot be read."""
    try:
        if v2:
            quota, period = (directory / "cpu.max").read_text().split()[:2]
        else:
            quota, period = ((directory / f"cpu.cfs_{n}_us").read_text().strip() for n in ("quota", "period"))
        if quota in ("max", "-1") or int(period) <= 0 or int(quota) <= 0:
            return None
        return int(quota) / int(period)
    except (OSError, ValueError):
        return None


def cpu_quota(cgroup_text: str | None = None, root: Path = CGROUP_ROOT) -> tuple[str, float] | None:
    """The tightest CPU quota over this process's cgroup and its ancestors (`cgroup_text`: /proc/self/cgroup's text),
    as (the limiting cgroup's name, _cgroup_key, and the CPUs it allows, possibly fractional); None where none binds. A container's
    or a job's CPU limit that leaves the affinity wide is such a quota (docker --cpus, systemd CPUQuota)."""
    if cgroup_text is None:
        try:
            cgroup_text = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    best: tuple[str, float] | None = None
    for line in cgroup_text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        hierarchy, controllers, path = fields
        v2 = hierarchy == "0" and controllers == ""
        if not v2 and "cpu" not in controllers.split(","):
            continue
        mounts = [root] if v2 else [root / controllers, root / "cpu,cpuacct", root / "cpu"]
        parts = [p for p in path.strip().split("/") if p]
        for mount in dict.fromkeys(mounts):
            for depth in range(len(parts), -1, -1):
                directory = mount.joinpath(*parts[:depth])
                cpus = _quota_file(directory, v2)
                if cpus is not None and (best is None or cpus < best[1]):
                    best = (_cgroup_key(directory, controllers or "v2", parts[:depth]), cpus)
    return best


def _cgroup_key(directory: Path, controllers: str, parts: list[str]) -> str:
    """One cgroup's name across processes: its path and its directory's inode, since containers with cgroup
    namespaces of their own each see their cgroup as "/"."""
    try:
        st = directory.stat()
        inode = f"@{st.st_dev}:{st.st_ino}"
    except OSError:
        inode = ""
    return f"{controllers}:/{'/'.join(parts)}{inode}"


def machine_sharing(reports) -> dict | None:
    """cpu_sharing's verdict from each rank's (kernel id, CPU affinity, cpu_quota()): per machine, the ranks against
    the CPUs they may run on, the union of their affinities, or less where every rank is under a quota (each
    distinct cgroup's quota counted once), in whole CPUs and at least 1; for the machine whose ranks most outnumber
    them, {"ranks": n, "cpus": c} where n > c, else None."""
    machines: dict[str, tuple[int, set, dict, bool]] = {}
    for kernel, cpus, quota in reports:
        ranks, union, quotas, unlimited = machines.get(kernel, (0, set(), {}, False))
        if quota is None:
            unlimited = True
        else:
            quotas[quota[0]] = quota[1]
        machines[kernel] = (ranks + 1, union | set(cpus), quotas, unlimited)
    counts = [(ranks, max(1, len(union) if unlimited else min(len(union), int(sum(quotas.values())))))
              for ranks, union, quotas, unlimited in machines.values()]
    ranks, cpus = max(counts, key=lambda c: c[0] / c[1])
    return {"ranks": ranks, "cpus": cpus} if ranks > cpus else None


def cpu_sharing(comm) -> dict | None:
    """Where ranks outnumber the CPUs they may run on (collective; every rank gets it): machine_sharing over every
    rank's affinity and CPU quota. Ranks of one kernel share its CPUs, whatever host names their namespaces give
    them."""
    mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return machine_sharing(comm.allgather((_kernel_id(), mine, cpu_quota())))


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
