"""SBP placements and signatures: Split(dim), Broadcast(), PartialSum() as frozen values (short forms S(0),
B, P); a signature is one placement per mesh axis.

Layout convention (the harness relies on it): when several mesh axes split the same tensor dim, the
block a device holds is numbered in mixed radix over those axes in ascending axis order (axis 0 is the
most significant digit). `local_slices` gives a device's block of the global tensor; under P every
device of the axis holds an addend of the same block (`partial_owner`: the one that holds it all after
a local B->P step)."""

from __future__ import annotations

import math
from functools import lru_cache


class Placement:
    """kind: "S" split, "B" broadcast, "P" partial sum; dim: the split tensor dim (-1 otherwise).
    Immutable and interned (one object per value), so equality and hashing are by identity and fast."""

    __slots__ = ("kind", "dim")
    _interned: dict = {}

    def __new__(cls, kind: str, dim: int = -1):
        key = (kind, int(dim) if kind == "S" else -1)
        obj = cls._interned.get(key)
        if obj is None:
            if kind not in ("S", "B", "P") or (kind == "S" and key[1] < 0):
                raise ValueError(f"bad placement {kind}({dim})")
            obj = object.__new__(cls)
            object.__setattr__(obj, "kind", key[0])
            object.__setattr__(obj, "dim", key[1])
            cls._interned[key] = obj
        return obj

    def __setattr__(self, name, value):
        raise AttributeError("Placement is immutable")

    def __reduce__(self):
        return (Placement, (self.kind, self.dim))

    def __repr__(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return f"S({self.dim})" if self.kind == "S" else self.kind

    def __lt__(self, other: "Placement") -> bool:
        return (self.kind, self.dim) < (other.kind, other.dim)

    @property
    def is_split(self) -> bool:
        return self.kind == "S"


def Split(dim: int) -> Placement:  # noqa: N802 - reads like the notation
    return Placement("S", dim)


def Broadcast() -> Placement:  # noqa: N802
    return Placement("B")


def PartialSum() -> Placement:  # noqa: N802
    return Placement("P")


S = Split
B = Broadcast()
P = PartialSum()

Signature = tuple[Placement, ...]


def fmt(sig: Signature) -> str:
    """(S(0), B) -> "[S(0), B]"."""
    return "[" + ", ".join(map(str, sig)) + "]"


def splitters(sig: Signature, dim: int) -> list[int]:
    """Mesh axes that split tensor dim `dim`, in ascending order."""
    return [a for a, p in enumerate(sig) if p.dim == dim]


@lru_cache(maxsize=1 << 16)
def split_factors(sig: Signature, mesh_shape: tuple[int, ...], ndim: int) -> tuple[int, ...]:
    """How many blocks each tensor dim is cut into."""
    return tuple(math.prod(mesh_shape[a] for a in splitters(sig, d)) for d in range(ndim))


@lru_cache(maxsize=1 << 16)
def indivisible(shape: tuple[int, ...], sig: Signature, mesh_shape: tuple[int, ...]) -> str | None:
    """Why `sig` cannot shard `shape` evenly, or None."""
    for d, f in enumerate(split_factors(sig, mesh_shape, len(shape))):
        if shape[d] % f:
            return f"dim {d} of size {shape[d]} is not divisible by {f} (signature {fmt(sig)})"
    for p in sig:
        if p.is_split and p.dim >= len(shape):
            return f"{p} splits a dim the {len(shape)}-d tensor does not have"
    return None


@lru_cache(maxsize=1 << 16)
def local_shape(shape: tuple[int, ...], sig: Signature, mesh_shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n // f for n, f in zip(shape, split_factors(sig, mesh_shape, len(shape))))


def local_slices(shape: tuple[int, ...], sig: Signature, mesh_shape: tuple[int, ...],
                 coord: tuple[int, ...]) -> tuple[slice, ...]:
    """The block of the global tensor that the device at mesh coordinate `coord` holds."""
    out = []
    for d, n in enumerate(shape):
        index, count = 0, 1
        for a in splitters(sig, d):
            index = index * mesh_shape[a] + coord[a]
            count *= mesh_shape[a]
        size = n // count
        out.append(slice(index * size, (index + 1) * size))
    return tuple(out)


def partial_owner(coord: tuple[int, ...], axis: int) -> bool:
    """After a local B->P step on `axis`, the member with coordinate 0 keeps the data, the others zeros."""
    return coord[axis] == 0
