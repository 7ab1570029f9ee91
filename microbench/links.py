"""Link classes, the one place that defines them: the names, what each means, which class a group of ranks forms
from its shape, and the order in which pricing falls back to another class when a calibration lacks one."""

from __future__ import annotations

LINK_CLASSES = ("intra", "inter", "spread")
"""intra: all ranks on one node; inter: one rank per node; spread: the job's own layout, several
ranks on each of several nodes."""

MEANING = {
    "intra": "all ranks on one node",
    "inter": "one rank per node",
    "spread": "several ranks on each of several nodes",
}
"""A calibration's link_classes[...].meaning of each class."""

FALLBACK = {"intra": ("intra", "spread", "inter"), "inter": ("inter", "spread", "intra"),
            "spread": ("spread", "inter", "intra")}
"""For each wanted class, the classes that may price it, in order (analysis.pricing)."""


def link_of(nodes: int, ranks_per_node: int) -> str:
    """The class of a group spanning `nodes` nodes with up to `ranks_per_node` ranks on each."""
    if nodes == 1:
        return "intra"
    return "inter" if ranks_per_node == 1 else "spread"
