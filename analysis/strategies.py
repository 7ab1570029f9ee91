"""A layer's strategies in one place: its SBP ones (analysis.layers) and, for a linear layer on a mesh of a grid's
shape, Colossal-AI's tensor-parallel ones (analysis.colossal). What search, validate and the harness ask of a
strategy (its signatures and schedule) is answered here for both families; `Selection` picks among them."""

from __future__ import annotations

from dataclasses import dataclass

from analysis import colossal
from analysis.layers import Layer, Linear, Schedule, Sigs
from analysis.mesh import Mesh
from microbench.errors import UsageError

FAMILIES = ("sbp", "cai", "cai-sbp")
"""sbp: the layer's SBP strategies; cai: Colossal-AI's; cai-sbp: each Colossal-AI strategy's SBP equivalent from and
to its placements (colossal.Framed, id SBP@cai-KIND), for comparing the two (validate runs it; search has the SBP
strategy itself)."""


def family(s) -> str:
    return {colossal.Grid: "cai", colossal.Framed: "cai-sbp"}.get(type(s), "sbp")


def strategies(layer: Layer, mesh: Mesh) -> list:
    """Every strategy of the layer on the mesh: the SBP ones, then the Colossal-AI ones its grid admits, each with
    its SBP equivalent."""
    return layer.strategies(mesh) + (colossal.strategies(layer, mesh) if isinstance(layer, Linear) else [])


def schedule(layer: Layer, s, mesh: Mesh, need_dx: bool = True) -> Schedule:
    if isinstance(s, colossal.Grid):
        return colossal.schedule(layer, s, mesh, need_dx)
    if isinstance(s, colossal.Framed):
        return colossal.framed_schedule(layer, s, mesh, need_dx)
    return layer.schedule(s, mesh, need_dx)


def sigs(layer: Layer, s) -> Sigs:
    return colossal.sigs(s) if family(s) != "sbp" else layer.sigs(s)


@dataclass(frozen=True)
class Selection:
    """Strategies picked by family (sbp, cai) or by id (e.g. m.n/ws, cai-2d)."""

    names: frozenset[str]

    def picks(self, s) -> bool:
        return family(s) in self.names or s.id in self.names

    def __str__(self) -> str:
        return ",".join(sorted(self.names))


def parse_selection(text: str) -> Selection:
    """"sbp", "cai", "sbp,cai", "cai-2d,m.n/ws" ... -> Selection (UsageError on an empty list)."""
    names = frozenset(t.strip() for t in text.split(",") if t.strip())
    if not names:
        raise UsageError(f"--strategies {text!r} names no strategy; give families ({', '.join(FAMILIES)}) or ids")
    return Selection(names)
