"""A device mesh over a job of nodes x ranks per node. Ranks number the mesh row-major (the last axis
varies fastest) and fill nodes in order: rank r lives on node r // ranks_per_node.

Each axis's process groups (the ranks that differ only in that axis's coordinate) have a shape: how many
nodes they span and how many of their ranks share a node. The shape names the link class that prices a
collective on the axis: "intra" (one node), "inter" (one rank per node) or "spread" (several of each).
When groups of one axis differ in shape (ranks per node not aligned with the mesh) the widest is used.

Switch levels (`spans`, from a calibration's topology): nodes fill switches in order, spans[k - 1] of them under
one switch of level k, so a group of one rank per node is priced on the highest level it crosses: "inter" where
its nodes share a leaf switch, "inter<k>" where their lowest common switch is at level k (the top level where the
mesh has more nodes than the calibration's tree holds). With 2 ranks per node on 2 racks of 2 nodes, a 2x2x2 mesh
places axis 2 within a node (intra), axis 1 within a rack (inter) and axis 0 across racks (inter2)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from microbench.errors import UsageError
from microbench.limits import MAX_RANKS
from microbench.links import link_of


@dataclass(frozen=True)
class AxisGroup:
    """The process groups of one mesh axis. `groups_per_node`: how many of the axis's groups have ranks on
    one node, i.e. how many run their collectives at once through that node's link."""

    axis: int
    size: int
    nodes: int
    ranks_per_node: int
    groups_per_node: int = 1
    level: int = 1               # the highest topology level its groups cross (0: within a node)

    @property
    def link(self) -> str:
        return link_of(self.nodes, self.ranks_per_node, self.level)


@dataclass(frozen=True)
class Mesh:
    shape: tuple[int, ...]
    ranks_per_node: int
    spans: tuple[int, ...] = ()  # nodes under one switch at each switch level (1 up); (): flat, one inter level

    def __post_init__(self) -> None:
        if not self.shape or any(n < 1 for n in self.shape):
            raise UsageError(f"mesh axes must be positive integers (got {self.shape})")
        if self.ranks_per_node < 1 or self.devices % self.ranks_per_node:
            raise UsageError(f"{self.ranks_per_node} ranks per node does not divide the mesh's "
                             f"{self.devices} devices")

    @property
    def devices(self) -> int:
        return math.prod(self.shape)

    @property
    def nodes(self) -> int:
        return self.devices // self.ranks_per_node

    def __str__(self) -> str:
        return "x".join(map(str, self.shape)) + f" ({self.nodes} nodes x {self.ranks_per_node} ranks)"

    def stride(self, axis: int) -> int:
        return math.prod(self.shape[axis + 1:])

    def coord(self, rank: int) -> tuple[int, ...]:
        out = []
        for axis in range(len(self.shape)):
            out.append(rank // self.stride(axis) % self.shape[axis])
        return tuple(out)

    def placed(self, spans: tuple[int, ...]) -> "Mesh":
        """This mesh on a cluster whose switches of level k hold spans[k - 1] nodes (calib's switch_spans)."""
        return self if spans == self.spans else Mesh(self.shape, self.ranks_per_node, tuple(spans))

    def groups(self, axis: int) -> list[list[int]]:
        """Every group on `axis`, by its first rank, each in coordinate order (the ranks laid out as the shape)."""
        ranks = np.arange(self.devices).reshape(self.shape)
        return np.moveaxis(ranks, axis, -1).reshape(-1, self.shape[axis]).tolist()

    @cached_property
    def axes(self) -> tuple[AxisGroup, ...]:
        return tuple(self._axis(axis, size) for axis, size in enumerate(self.shape))

    def _axis(self, axis: int, size: int) -> AxisGroup:
        """One axis's groups summed up, all groups at once: each group's nodes (rows, ascending as its ranks are),
        its widest group's nodes and ranks per node, how many groups share a node, the highest level crossed."""
        nodes = np.asarray(self.groups(axis)) // self.ranks_per_node
        rows = np.arange(len(nodes))
        pairs, counts = np.unique(nodes + rows[:, None] * self.nodes, return_counts=True)   # (group, node) once
        group, node = pairs // self.nodes, pairs % self.nodes
        widths = np.bincount(group, minlength=len(nodes))
        fullest = np.zeros(len(nodes), dtype=int)
        np.maximum.at(fullest, group, counts)
        wide = int(widths.max())
        per_node = int(fullest[widths == wide].max())
        sharing = int(np.bincount(node).max())
        if wide == 1:
            return AxisGroup(axis, size, 1, per_node, sharing, 0)
        lo, hi = nodes.min(axis=1), nodes.max(axis=1)
        crossed = lo != hi
        return AxisGroup(axis, size, wide, per_node, sharing, self._level(lo[crossed], hi[crossed]))

    def _level(self, lo: np.ndarray, hi: np.ndarray) -> int:
        """The highest of the levels that groups spanning nodes lo..hi cross (level() of each, at once)."""
        level = np.full(len(lo), max(len(self.spans), 1))
        for k, span in reversed(list(enumerate(self.spans, start=1))):
            level[lo // span == hi // span] = k
        return max(int(level.max()), 1)


MAX_AXES = 5
"""The most axes a mesh may have: each axis multiplies a layer's strategies (their SBP placements per axis) and with
them the time to search or price it."""


def parse_mesh(text: str, ranks_per_node: int | None = None, devices: int | None = None) -> Mesh:
    """"2x4" -> Mesh((2, 4)); ranks per node defaults to the last axis's size; `devices`, when given, must
    equal the mesh's device count."""
    if not re.fullmatch(r"\d+(x\d+)*", text.strip()):
        raise UsageError(f"bad mesh {text!r}; write axis sizes like 2x4 or 2x2x2")
    shape = tuple(int(t) for t in text.strip().split("x"))
    if ranks_per_node is not None and ranks_per_node < 1:
        raise UsageError(f"--ranks-per-node must be 1 or more, not {ranks_per_node}")
    if len(shape) > MAX_AXES:
        raise UsageError(f"mesh {text} has {len(shape)} axes; commcal searches meshes of up to {MAX_AXES}")
    if any(n > MAX_RANKS for n in shape) or math.prod(shape) > MAX_RANKS:
        raise UsageError(f"mesh {text} has more than {MAX_RANKS} devices")
    if devices is not None and math.prod(shape) != devices:
        raise UsageError(f"mesh {text} has {math.prod(shape)} devices, not the {devices} devices asked for")
    return Mesh(shape, ranks_per_node or shape[-1])
