"""A compute profile: the measured seconds of each local kernel (a layers.Compute at its local shapes and element type),
as `commcal profile` times it with every rank of a node computing at once, for pricing to use in place of the
calibration's roofline (GEMM rate and copy rate), the way ParaDL's oracle takes its layers' compute from profiling.
The file is versioned JSON written atomically; any problem reading it is one UsageError line. Pure: no MPI."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from microbench.atomic import atomic_write_json
from microbench.errors import UsageError
from microbench.jsonfile import input_path, read_json
from microbench.limits import MAX_RANKS, MAX_SECONDS

FORMAT = "commcal-profile"
VERSION = 1


@dataclass(frozen=True)
class KernelKey:
    """What a kernel's time depends on: its expression, operand and output shapes (local) and element type."""

    expr: str
    operands: tuple[tuple[int, ...], ...]
    out: tuple[int, ...]
    dtype: str

    @classmethod
    def of(cls, step, dtype: str) -> KernelKey:
        return cls(step.expr, tuple(tuple(s) for s in step.operand_shapes), tuple(step.out_shape), dtype)


@dataclass(frozen=True)
class Kernel:
    """One profiled kernel: the median of its samples (each the slowest rank's time of one call) and their
    interquartile range over the median."""

    key: KernelKey
    median_s: float
    samples: int
    spread: float


@dataclass(frozen=True)
class Profile:
    """Profiled kernels and where they were measured (ranks at once per node, hosts, host memory setup, the backend
    whose device ran them: mpi on the host, mpi-cuda or nccl on the GPU) and, per host, the share of its CPU a
    hypervisor took while they were timed (cpu_steal, None where the host could not tell; empty in older files)."""

    kernels: tuple[Kernel, ...]
    ranks: int
    ranks_per_node: int
    hosts: tuple[str, ...]
    created: str
    allocator: str
    page_policy: str
    backend: str = "mpi"
    path: str = ""
    cpu_steal: tuple[tuple[str, float | None], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_key", {k.key: k.median_s for k in self.kernels})

    def seconds(self, step, dtype: str) -> float | None:
        """The profiled seconds of a Compute step in `dtype`, or None where the profile lacks it."""
        return self._by_key.get(KernelKey.of(step, dtype))

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "created": self.created, "ranks": self.ranks,
                "ranks_per_node": self.ranks_per_node, "hosts": list(self.hosts), "allocator": self.allocator,
                "page_policy": self.page_policy, "backend": self.backend, "cpu_steal": dict(self.cpu_steal),
                "kernels": [{"expr": k.key.expr, "operands": [list(s) for s in k.key.operands], "out": list(k.key.out),
                             "dtype": k.key.dtype, "median_s": k.median_s, "samples": k.samples, "spread": k.spread}
                            for k in self.kernels]}


def write_profile(profile: Profile, path) -> Path:
    return atomic_write_json(path, profile.to_dict())


def _shape(value, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                              for n in value):
        raise ValueError(f"{what} is not a list of sizes")
    return tuple(value)


def _kernel(d, i: int) -> Kernel:
    where = f"kernel {i}"
    if not isinstance(d, dict):
        raise ValueError(f"{where} is not an object")
    expr, dtype, median, samples, spread = (d.get(k) for k in ("expr", "dtype", "median_s", "samples", "spread"))
    if not isinstance(expr, str) or not isinstance(dtype, str):
        raise ValueError(f"{where}: expr and dtype must be strings")
    operands = d.get("operands")
    if not isinstance(operands, list):
        raise ValueError(f"{where}: operands is not a list")
    key = KernelKey(expr, tuple(_shape(s, f"{where} operand") for s in operands), _shape(d.get("out"), f"{where} out"),
                    dtype)
    if isinstance(median, bool) or not isinstance(median, (int, float)) or not 0 < median <= MAX_SECONDS:
        raise ValueError(f"{where}: median_s must be a positive number of seconds, {MAX_SECONDS:g} at most")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"{where}: samples must be a positive integer")
    if isinstance(spread, bool) or not isinstance(spread, (int, float)) or not spread >= 0:
        raise ValueError(f"{where}: spread must be a non-negative number")
    return Kernel(key, float(median), samples, float(spread))


def profile_from_dict(data, path: str = "") -> Profile:
    """A Profile from its JSON object; ValueError naming the first problem."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"not a compute profile (format is not {FORMAT!r}): write one with `commcal profile`")
    if data.get("version") != VERSION or isinstance(data.get("version"), bool):
        raise ValueError(f"profile version {data.get('version')!r}; this commcal reads version {VERSION}")
    kernels = data.get("kernels")
    if not isinstance(kernels, list):
        raise ValueError("kernels is not a list")
    ranks, per_node, hosts = data.get("ranks"), data.get("ranks_per_node"), data.get("hosts")
    for name, v in (("ranks", ranks), ("ranks_per_node", per_node)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_RANKS:
            raise ValueError(f"{name} must be an integer from 1 to {MAX_RANKS}")
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise ValueError("hosts is not a list of names")
    texts = [data.get(k) for k in ("created", "allocator", "page_policy", "backend")]
    if not all(isinstance(t, str) for t in texts):
        raise ValueError("created, allocator, page_policy and backend must be strings")
    steal = data.get("cpu_steal", {})
    if not isinstance(steal, dict) or not all(f is None or (isinstance(f, (int, float)) and not isinstance(f, bool)
                                                            and 0 <= f <= 1) for f in steal.values()):
        raise ValueError("cpu_steal is not a table of host shares between 0 and 1")
    return Profile(tuple(_kernel(k, i) for i, k in enumerate(kernels)), ranks, per_node, tuple(hosts), *texts,
                   path=path, cpu_steal=tuple((str(h), None if f is None else float(f)) for h, f in steal.items()))


def load_profile(path) -> Profile:
    """Read and check a profile file; any problem is one UsageError line."""
    p = input_path(path)
    data = read_json(p, "profile")
    try:
        return profile_from_dict(data, str(p))
    except ValueError as exc:
        raise UsageError(f"{p}: {exc}") from None
