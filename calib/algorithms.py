"""Algorithm cost shapes: t = a(p) * alpha + b(p) * n * beta for each collective algorithm, with n in
the nccl-tests size convention of microbench/records.py. The fit picks among an operation's candidates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from microbench.errors import UsageError


def _log2(p):
    """Rounds of a tree or recursive-doubling algorithm on p ranks (ceil(log2 p), at least 1)."""
    return np.maximum(1.0, np.ceil(np.log2(np.maximum(np.asarray(p, dtype=float), 2.0))))


def _lin(p):
    return np.asarray(p, dtype=float) - 1.0


def _ring(p):
    p = np.asarray(p, dtype=float)
    return (p - 1.0) / p


def _one(p):
    return np.ones_like(np.asarray(p, dtype=float))


@dataclass(frozen=True)
class Algorithm:
    """One algorithm's coefficients: a(p) multiplies alpha, b(p) multiplies n * beta."""

    name: str
    a: Callable
    b: Callable
    description: str

    def coefficients(self, procs) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self.a(procs), dtype=float), np.asarray(self.b(procs), dtype=float)


_ALGS = {alg.name: alg for alg in (
    Algorithm("ring", lambda p: 2 * _lin(p), lambda p: 2 * _ring(p), "ring allreduce: 2(p-1) alpha + 2(p-1)/p n beta"),
    Algorithm("rabenseifner", lambda p: 2 * _log2(p), lambda p: 2 * _ring(p),
              "recursive halving reduce-scatter + recursive doubling allgather: 2 log2p alpha + 2(p-1)/p n beta"),
    Algorithm("recursive_doubling", _log2, _log2, "recursive doubling on the whole buffer: log2p (alpha + n beta)"),
    Algorithm("ring_blocks", _lin, _ring, "ring / pairwise exchange of p blocks: (p-1) alpha + (p-1)/p n beta"),
    Algorithm("recursive_blocks", _log2, _ring,
              "recursive doubling (allgather) / halving (reduce-scatter): log2p alpha + (p-1)/p n beta"),
    Algorithm("bruck", _log2, lambda p: _log2(p) / 2, "Bruck alltoall: log2p alpha + log2p/2 n beta"),
    Algorithm("binomial_tree", _log2, _log2, "binomial tree: log2p (alpha + n beta)"),
    Algorithm("linear", _lin, _lin, "root exchanges with every rank in turn: (p-1) (alpha + n beta)"),
    Algorithm("scatter_allgather", lambda p: _log2(p) + _lin(p), lambda p: 2 * _ring(p),
              "scatter then ring allgather (van de Geijn): (log2p + p-1) alpha + 2(p-1)/p n beta"),
    Algorithm("p2p", _one, _one, "one message: alpha + n beta"),
    Algorithm("hockney", _one, _one, "per-process-count Hockney line: alpha + n beta"),
)}

CANDIDATES: dict[str, tuple[str, ...]] = {
    "allreduce": ("ring", "rabenseifner", "recursive_doubling"),
    "allgather": ("ring_blocks", "recursive_blocks", "linear"),
    "reduce_scatter": ("ring_blocks", "recursive_blocks", "linear"),
    "alltoall": ("ring_blocks", "bruck", "linear"),
    "bcast": ("binomial_tree", "scatter_allgather", "linear"),
    "reduce": ("binomial_tree", "rabenseifner", "linear"),
    "pingpong": ("p2p",),
    "sendrecv": ("p2p",),
}
"""Candidates per operation, the most common large-message default first (it wins ties). Shapes that are
a constant multiple of another (binomial reduce + bcast = 2 x recursive doubling) would fit identically,
so only one of them is listed."""

P2P_OPS = ("pingpong", "sendrecv")


def algorithm(name: str) -> Algorithm:
    try:
        return _ALGS[name]
    except KeyError:
        raise UsageError(f"unknown algorithm model {name!r}; known: {', '.join(_ALGS)}") from None


def candidates(op: str) -> tuple[Algorithm, ...]:
    try:
        return tuple(_ALGS[n] for n in CANDIDATES[op])
    except KeyError:
        raise UsageError(f"no algorithm models for operation {op!r}; known: {', '.join(CANDIDATES)}") from None


def distinguishable(algs: tuple[Algorithm, ...], procs) -> bool:
    """Whether the process counts seen can tell these algorithms apart: with one p (or p where all
    candidates' a and b are proportional) every candidate fits equally well."""
    procs = np.unique(np.asarray(procs, dtype=float))
    if len(procs) < 2:
        return False
    shapes = set()
    for alg in algs:
        a, b = alg.coefficients(procs)
        shapes.add((tuple(np.round(a / a[0], 9)), tuple(np.round(b / b[0], 9))))
    return len(shapes) > 1


def segment_bounds(max_bytes, min_bytes) -> np.ndarray:
    """Sizes at which segment i+1 takes over from segment i: the geometric middle of the gap between them."""
    with np.errstate(over="ignore"):
        return np.sqrt(np.maximum(np.asarray(max_bytes[:-1], dtype=float), 1.0)
                       * np.maximum(np.asarray(min_bytes[1:], dtype=float), 1.0))


def piecewise_terms(alg: Algorithm, bounds: np.ndarray, alpha: np.ndarray, beta: np.ndarray, procs, nbytes):
    """(seconds, segment index, a, b*n) of a piecewise model for each size: the one prediction rule that
    the fit's held-out check and the calibration's predictions share."""
    nbytes = np.asarray(nbytes, dtype=float)
    seg = np.searchsorted(bounds, nbytes, side="right")
    a, b = alg.coefficients(procs)
    with np.errstate(over="ignore", invalid="ignore"):   # a schema-valid 1e308 parameter prices inf, not a warning
        bn = b * nbytes
        return a * alpha[seg] + bn * beta[seg], seg, a, bn


def known_algorithms() -> tuple[str, ...]:
    return tuple(_ALGS)
