"""What run.json records about where and how a sweep ran."""

from __future__ import annotations

import os
import platform
import re
import socket
import sys
from datetime import datetime, timezone

import numpy as np

ENV_PREFIXES = ("OMPI_", "PRTE_", "PMIX_", "UCX_", "NCCL_", "SLURM_", "MPICH_", "I_MPI_", "CUDA_")


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


def machine_name(hosts: list[str]) -> str:
    """The cluster's name for file names: Slurm's cluster name, else the first host's name."""
    return os.environ.get("SLURM_CLUSTER_NAME") or (hosts[0] if hosts else socket.gethostname())


def software_versions() -> dict[str, str]:
    import mpi4py

    return {"python": sys.version.split()[0], "numpy": np.__version__, "mpi4py": mpi4py.__version__,
            "platform": platform.platform()}
