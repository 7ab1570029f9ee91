"""Link classes, the one place that defines them: the names, what each means, which class a group of ranks forms
from its shape, and the order in which pricing falls back to another class when a calibration lacks one.

Link classes are levels of the network hierarchy (docs/methodology.md, "Topology levels"): level 0 is within a
node ("intra"), level 1 the first switch level ("inter": nodes under one leaf switch, or every node where the
topology is unknown), level k >= 2 "inter<k>" (nodes whose lowest common switch is k levels up: "inter2" crosses
leaf switches through a spine). "spread" stays the job's own layout, several ranks on each of several nodes."""

from __future__ import annotations

import re

LINK_CLASSES = ("intra", "inter", "spread")
"""The classes every topology has. intra: all ranks on one node; inter: one rank per node (under one leaf switch
where the topology has levels); spread: the job's own layout, several ranks on each of several nodes."""

MAX_LEVEL = 9
"""The highest switch level a link class names (inter9): deeper trees than any cluster's."""

_LEVEL = re.compile(r"inter([2-9])")


def level_link(level: int) -> str:
    """The link class of topology level `level` (0: intra, 1: inter, k: inter<k>)."""
    if not 0 <= level <= MAX_LEVEL:
        raise ValueError(f"topology level {level} outside 0..{MAX_LEVEL}")
    return ("intra", "inter")[level] if level < 2 else f"inter{level}"


def link_level(link: str) -> int | None:
    """The topology level of a link class; None for spread (several nodes, several ranks on each)."""
    if link in ("intra", "inter"):
        return ("intra", "inter").index(link)
    m = _LEVEL.fullmatch(link)
    return int(m.group(1)) if m else None


def is_link(name: object) -> bool:
    """Whether `name` is a link class (a base class or a switch level inter2..inter9)."""
    return isinstance(name, str) and (name in LINK_CLASSES or _LEVEL.fullmatch(name) is not None)


def links_for(height: int) -> tuple[str, ...]:
    """Every link class of a topology with `height` switch levels (1: flat), innermost first, spread last."""
    return ("intra", *(level_link(k) for k in range(1, max(height, 1) + 1)), "spread")


def meaning(link: str) -> str:
    """A calibration's link_classes[...].meaning of each class."""
    level = link_level(link)
    if link == "spread":
        return "several ranks on each of several nodes"
    if level == 0:
        return "all ranks on one node"
    if level == 1:
        return "one rank per node (under one leaf switch where the topology has switch levels)"
    return f"one rank per node, nodes whose lowest common switch is at level {level}"


def fallback(wanted: str) -> tuple[str, ...]:
    """For a wanted class, the classes that may price it, in order (analysis.pricing): the class itself, then the
    nearest other switch levels (the lower first at equal distance), then spread, then intra; intra falls back to
    spread, then the switch levels upwards; spread to the switch levels, then intra. Without switch levels this is
    intra -> spread -> inter, inter -> spread -> intra, spread -> inter -> intra."""
    levels = [level_link(k) for k in range(1, MAX_LEVEL + 1)]
    if wanted == "intra":
        return ("intra", "spread", *levels)
    if wanted == "spread":
        return ("spread", *levels, "intra")
    k = link_level(wanted)
    if k is None or k == 0:
        raise ValueError(f"unknown link class {wanted!r}")
    near = sorted(levels, key=lambda name: (abs(link_level(name) - k), link_level(name)))
    return (*near, "spread", "intra")


def link_of(nodes: int, ranks_per_node: int, level: int = 1) -> str:
    """The class of a group spanning `nodes` nodes with up to `ranks_per_node` ranks on each, the nodes' lowest
    common switch at topology `level` (1 without a topology)."""
    if nodes == 1:
        return "intra"
    return level_link(level) if ranks_per_node == 1 else "spread"
