"""The network's switch tree, as topology levels: which nodes share a switch at each level. Read from Slurm's
tree topology (topology.conf, or `scontrol show topology`, the same SwitchName=... lines), from a file of such lines
(`sweep --topology FILE`), or flat (no switch levels: every node one "inter" level). Parsing is pure; only
`discover` runs scontrol."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from microbench.errors import UsageError
from microbench.jsonfile import read_text
from microbench.limits import MAX_RANKS
from microbench.links import MAX_LEVEL, level_link


@dataclass(frozen=True)
class Switch:
    """One SwitchName line: the nodes and the switches directly below it."""

    name: str
    nodes: tuple[str, ...] = ()
    switches: tuple[str, ...] = ()


@dataclass(frozen=True)
class Topology:
    """`levels[k - 1]`: the groups of nodes that share a switch at level k (1: leaf switches), each group's nodes
    in order, the groups of a level a partition of every node, each nested in one group of the next level. No
    levels: flat (the topology is unknown; every node pair is one "inter" level). `source` says where it came
    from: "flat", "slurm" or the file."""

    source: str = "flat"
    levels: tuple[tuple[tuple[str, ...], ...], ...] = ()

    @property
    def height(self) -> int:
        """Switch levels (1 when flat: the nodes are joined, how is unknown)."""
        return max(len(self.levels), 1)

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every node the topology names, leaf group by leaf group (none when flat)."""
        return tuple(n for group in self.levels[0] for n in group) if self.levels else ()

    def restrict(self, hosts: list[str]) -> "Topology":
        """The topology of the job's nodes (hostnames in `hosts`, in their order of first appearance), groups in
        the order of their first node; a host the topology does not name is an error. Names match as given, else
        by their first label (node1 for node1.cluster)."""
        if not self.levels:
            return self
        nodes = list(dict.fromkeys(hosts))
        known = set(self.nodes)
        short = {n.split(".")[0]: n for n in known}
        name = {h: h if h in known else short.get(h.split(".")[0]) for h in nodes}
        missing = [h for h, n in name.items() if n is None]
        if missing:
            raise UsageError(f"topology ({self.source}) does not name node {missing[0]!r} of this job")
        order = {name[h]: i for i, h in enumerate(nodes)}
        levels = []
        for level in self.levels:
            groups = [tuple(sorted((n for n in g if n in order), key=order.get)) for g in level]
            groups = sorted((g for g in groups if g), key=lambda g: order[g[0]])
            levels.append(tuple(tuple(nodes[order[n]] for n in g) for g in groups))
        return Topology(self.source, tuple(levels))

    def group_of(self, level: int, node: str) -> tuple[str, ...]:
        """The nodes sharing `node`'s switch at `level` (0: the node alone)."""
        if level == 0:
            return (node,)
        return next(g for g in self.levels[level - 1] if node in g)

    def to_json(self) -> dict:
        return {"source": self.source, "levels": [{"link": level_link(k), "level": k, "groups": [list(g) for g in gs]}
                                                  for k, gs in enumerate(self.levels, start=1)]}

    @classmethod
    def from_json(cls, data: dict | None) -> "Topology":
        """to_json's dict back; ValueError where a level holds no group, or a group no node name."""
        if not data:
            return cls()
        levels = tuple(tuple(tuple(g) for g in lv["groups"]) for lv in data["levels"])
        if not all(level and all(g and all(isinstance(n, str) for n in g) for g in level) for level in levels):
            raise ValueError("a switch level without groups, or a group without node names")
        return cls(str(data["source"]), levels)


def expand_hostlist(text: str) -> list[str]:
    """Slurm's hostlist expression as names: node[1-3,7],gpu[01-02]x -> node1 node2 node3 node7 gpu01x gpu02x
    (ranges keep their zero padding; several bracket groups in one name multiply). UsageError for unbalanced
    brackets, and beyond MAX_RANKS names: no machine has that many, and a mistyped range would fill memory."""
    if not re.fullmatch(r"[^\[\]]*(?:\[[^\[\]]*\][^\[\]]*)*", text):   # '[' and ']' alternate, none nested
        raise UsageError(f"unbalanced brackets in host list {text[:80]!r}")
    names: list[str] = []
    for item in (i.strip() for i in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text)):
        parts = re.split(r"\[([^\]]*)\]", item)          # text, group, text, ..., text
        groups = [_ranges(g, text) for g in parts[1::2]]
        if len(names) + math.prod(sum(len(r) for r, _ in g) for g in groups) > MAX_RANKS:
            raise UsageError(f"host list {text[:80]!r} names more than {MAX_RANKS} hosts")
        expanded = [parts[0]] if item else []
        for group, after in zip(groups, parts[2::2]):
            numbers = [f"{i:0{width}d}" for r, width in group for i in r]
            expanded = [f"{name}{n}{after}" for name in expanded for n in numbers]
        names += expanded
    return names


def _ranges(group: str, text: str) -> list[tuple[range, int]]:
    """The ranges of one bracket group ('1-3,07') and the width each pads its numbers to (0: none)."""
    out = []
    for part in group.split(","):
        lo, _, hi = part.partition("-")
        hi = hi or lo
        if not (lo.isdecimal() and hi.isdecimal() and max(len(lo), len(hi)) <= 18 and int(lo) <= int(hi)):
            raise UsageError(f"bad host range {part[:40]!r} in {text[:80]!r}")
        out.append((range(int(lo), int(hi) + 1), len(lo) if lo.startswith("0") else 0))
    return out


def parse_switches(text: str, where: str) -> list[Switch]:
    """The SwitchName lines of a topology.conf or of `scontrol show topology` (other keys, comments and other lines
    are ignored); at most MAX_RANKS names of nodes and switches in all, counted over every line."""
    switches, named = [], 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        fields = dict(re.findall(r"(\w+)=(\S+)", line))
        if "SwitchName" not in fields:
            continue
        lists = []
        for key in ("Nodes", "Switches"):   # the total checked after each list: memory holds at most 2 * MAX_RANKS
            try:
                lists.append(tuple(expand_hostlist(fields.get(key, ""))))
            except UsageError as exc:
                raise UsageError(f"{where}: {exc}") from None
            named += len(lists[-1])
            if named > MAX_RANKS:
                raise UsageError(f"{where} names more than {MAX_RANKS} nodes and switches in all by line {number} "
                                 f"(switch {fields['SwitchName'][:40]!r})")
        switches.append(Switch(fields["SwitchName"], *lists))
    names = [s.name for s in switches]
    if len(set(names)) != len(names):
        raise UsageError(f"{where}: switch {next(n for n in names if names.count(n) > 1)!r} is named twice")
    return switches


def tree(switches: list[Switch], source: str) -> Topology:
    """The levels of a switch tree. A switch's level is 1 for a leaf (nodes only), else one more than its highest
    child; a node's group at level k is the nodes under its lowest ancestor at level k or above. In
    `scontrol show topology` a switch above others also lists their nodes: a switch's own nodes are those no child
    holds. UsageError for a cycle, a child that is not a switch, or a node under two leaves."""
    if not switches:
        return Topology()
    by_name = {s.name: s for s in switches}
    for s in switches:
        for child in s.switches:
            if child not in by_name:
                raise UsageError(f"{source}: switch {s.name!r} names unknown switch {child!r}")
    level: dict[str, int] = {}
    under: dict[str, list[str]] = {}

    def too_high() -> UsageError:
        """The one refusal of a tree too high, whichever order its switches are listed in."""
        return UsageError(f"{source}: more than {MAX_LEVEL} switch levels; commcal names at most {MAX_LEVEL}")

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in path:
            raise UsageError(f"{source}: switches form a cycle through {name!r}")
        if name in level:
            return
        if len(path) >= MAX_LEVEL:   # a chain this long is too high already; deeper, the recursion would overflow
            raise too_high()
        s = by_name[name]
        for child in s.switches:
            visit(child, (*path, name))
        level[name] = 1 + max((level[c] for c in s.switches), default=0)
        if level[name] > MAX_LEVEL:  # a chain listed bottom-up: each switch's children were visited already
            raise too_high()
        below = [n for c in s.switches for n in under[c]]
        under[name] = below + [n for n in s.nodes if n not in below]

    for s in switches:
        visit(s.name, ())
    height = max(level.values())
    parent: dict[str, str] = {}
    for s in switches:
        for child in s.switches:
            if parent.setdefault(child, s.name) != s.name:
                raise UsageError(f"{source}: switch {child!r} is below both {parent[child]!r} and {s.name!r}")
    leaf_of: dict[str, str] = {}
    for s in switches:
        for n in under[s.name]:
            if n not in {m for c in s.switches for m in under[c]}:
                if leaf_of.setdefault(n, s.name) != s.name:
                    raise UsageError(f"{source}: node {n!r} is under both {leaf_of[n]!r} and {s.name!r}")
    nodes = list(leaf_of)
    levels = []
    for k in range(1, height + 1):
        groups: dict[str, list[str]] = {}
        for n in nodes:
            sw = leaf_of[n]
            while level[sw] < k and sw in parent:
                sw = parent[sw]
            groups.setdefault(sw, []).append(n)
        levels.append(tuple(tuple(g) for g in groups.values()))
    return Topology(source, tuple(levels))


def read_topology(path: str) -> Topology:
    """A topology file: Slurm's topology.conf syntax (SwitchName=... Nodes=... / Switches=...) or saved
    `scontrol show topology` output."""
    switches = parse_switches(read_text(path, "topology file", f"--topology {path}"), path)
    if not switches:
        raise UsageError(f"--topology {path}: no SwitchName= lines (expected Slurm's topology.conf syntax)")
    return tree(switches, path)


def discover(path: str | None) -> Topology:
    """The topology the sweep uses: --topology's file; else, inside a Slurm job, `scontrol show topology` (flat when
    Slurm has no tree topology or scontrol fails); else flat."""
    if path:
        return read_topology(path)
    scontrol = shutil.which("scontrol")
    if not os.environ.get("SLURM_JOB_ID") or scontrol is None:
        return Topology()
    try:
        out = subprocess.run([scontrol, "show", "topology"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return Topology()
    if out.returncode != 0:
        return Topology()
    try:
        return tree(parse_switches(out.stdout, "scontrol show topology"), "slurm")
    except UsageError:
        return Topology()


LEVEL_GAP = 1.3
"""Inferring levels from a scan: node pairs whose bandwidths differ by more than this factor (and nothing in between)
cross different switch levels. A scan's pairs repeat within a few percent; a switch level above another is slower by
its oversubscription, commonly 2x or more."""


@dataclass(frozen=True)
class Inferred:
    """Levels inferred from a scan's pair bandwidths, or why none were (`why`: empty when the tree was inferred)."""

    topology: Topology
    why: str = ""

    def conf(self) -> str:
        """The tree as topology.conf lines (what `sweep --topology FILE` reads); empty when flat."""
        lines, names = [], {}
        for k, level in enumerate(self.topology.levels, 1):
            for i, group in enumerate(level):
                names[(k, group)] = f"s{k}-{i}"
                below = sorted({names[(k - 1, g)] for g in self.topology.levels[k - 2] if set(g) <= set(group)}) \
                    if k > 1 else []
                what = f"Switches={','.join(below)}" if below else f"Nodes={','.join(group)}"
                lines.append(f"SwitchName={names[(k, group)]} {what}")
        return "\n".join(lines) + ("\n" if lines else "")


def infer_levels(bandwidth: dict[tuple[str, str], float], nodes: list[str]) -> Inferred:
    """Switch levels from every node pair's bandwidth: the pairs fall into tiers (sorted by bandwidth, a new tier
    where the next is slower by more than LEVEL_GAP); level k groups the nodes joined by pairs of the k fastest tiers.
    A node left alone at a level while others share a switch is a slow node, not a level: nothing is inferred then
    (the scan's verdicts name it)."""
    rates = sorted((r for r in bandwidth.values() if r > 0), reverse=True)
    if len(nodes) < 3 or len(bandwidth) < len(nodes) * (len(nodes) - 1) // 2 or len(rates) < len(bandwidth):
        return Inferred(Topology(), "too few nodes or pairs measured to infer levels")
    floors = [a for a, b in zip(rates, rates[1:]) if a / b > LEVEL_GAP] + [rates[-1]]  # each tier's slowest rate
    levels = []
    for floor in floors:
        parent = {n: n for n in nodes}

        def root(n: str) -> str:
            while parent[n] != n:
                n = parent[n]
            return n

        for (a, b), r in bandwidth.items():
            if r >= floor:
                parent[root(a)] = root(b)
        groups: dict[str, list[str]] = {}
        for n in nodes:
            groups.setdefault(root(n), []).append(n)
        level = tuple(tuple(g) for g in groups.values())
        if len(level) > 1 and any(len(g) == 1 for g in level):
            alone = next(g[0] for g in level if len(g) == 1)
            return Inferred(Topology(), f"node {alone} is slower to every other node than they are to each other: "
                                        f"a slow node, not a switch level")
        levels.append(level)
    if len(levels) == 1:
        return Inferred(Topology(), "every pair is within one tier: one switch level (flat)")
    return Inferred(Topology("scan", tuple(levels)))
