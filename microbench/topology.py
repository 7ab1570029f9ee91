"""Which ranks share a node, and which groups of ranks form each link class. Pure: works on the
list of every world rank's hostname and the job's switch tree (microbench.switches), so it is tested without MPI."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from microbench.errors import UsageError
from microbench.links import is_link, link_level, links_for
from microbench.switches import Topology


@dataclass(frozen=True)
class Group:
    """The world ranks that measure one (link class, process count); world rank 0 is always first."""

    link: str
    procs: int
    nodes: int
    ranks_per_node: int
    ranks: tuple[int, ...]


def nodes_of(hosts: list[str]) -> tuple[tuple[int, ...], ...]:
    """World ranks per node, nodes ordered by their lowest rank (rank 0's node first)."""
    return _nodes_of(tuple(hosts))


@lru_cache(maxsize=4)
def _nodes_of(hosts: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    """nodes_of, kept for the job's one host list: a plan asks it once per group, and a job may hold 2^20 ranks."""
    by_host: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        by_host.setdefault(host, []).append(rank)
    return tuple(tuple(ranks) for ranks in by_host.values())


def level_nodes(level: int, procs: int, hosts: list[str], topo: Topology = Topology()) -> list[str] | None:
    """The `procs` nodes (hostnames, job order) whose lowest common switch is at `level` >= 1, rank 0's among them,
    or None where the job cannot form them: under rank 0's switch at that level, as even a share as fits from each
    of its first min(procs, children) children (the groups of the level below), contiguous in topology order, so
    every child crosses the level to the next (p = 2 on two racks: one node in each). Flat: the first procs nodes."""
    names = list(dict.fromkeys(hosts))
    if procs < 2:
        return None
    if not topo.levels:
        return names[:procs] if level == 1 and procs <= len(names) else None
    if level > len(topo.levels):
        return None
    top = topo.group_of(level, names[0])
    children = list(dict.fromkeys(topo.group_of(level - 1, n) for n in top))
    used = min(procs, len(children))
    if used < 2:
        return None
    share = [procs // used + (i < procs % used) for i in range(used)]
    if any(len(child) < want for child, want in zip(children, share)):
        return None
    return [n for child, want in zip(children, share) for n in child[:want]]


def group_for(link: str, procs: int, hosts: list[str], topo: Topology = Topology()) -> Group | None:
    """The group measuring `link` at `procs` ranks, or None if this job's layout cannot form it.

    intra: procs ranks of rank 0's node. inter, inter<k>: the lowest rank of each of level_nodes' nodes. spread:
    r ranks on each of n >= 2 nodes (n * r = procs, r >= 2), as many nodes as fit."""
    nodes = nodes_of(hosts)
    level = link_level(link)
    if link == "intra":
        if procs <= len(nodes[0]):
            return Group(link, procs, 1, procs, tuple(nodes[0][:procs]))
        return None
    if level is not None:
        chosen = level_nodes(level, procs, hosts, topo)
        if chosen is None:
            return None
        first = {hosts[n[0]]: n[0] for n in nodes}
        return Group(link, procs, procs, 1, tuple(first[h] for h in chosen))
    if link == "spread":
        for n in range(min(len(nodes), procs // 2), 1, -1):
            r = procs // n
            if n * r == procs and r >= 2 and all(len(node) >= r for node in nodes[:n]):
                return Group(link, procs, n, r, tuple(rank for node in nodes[:n] for rank in node[:r]))
        return None
    raise UsageError(f"unknown link class {link!r}; choose from {', '.join(links_for(topo.height))}")


def tiles(link: str, procs: int, hosts: list[str], topo: Topology = Topology()) -> tuple[Group, ...]:
    """Disjoint groups of group_for's shape, as many as the job holds, group_for's own first: what runs at
    once in a concurrent sweep, the way all groups of a mesh axis run at once in training. Lane j of a
    node is its j-th rank; intra groups take consecutive ranks of one node, inter groups one lane across
    procs nodes, spread groups r consecutive lanes across n nodes. With switch levels, a level's groups are
    the lanes of group_for's own nodes."""
    first = group_for(link, procs, hosts, topo)
    if first is None:
        return ()
    nodes = nodes_of(hosts)
    n, r = first.nodes, first.ranks_per_node
    lanes = min(len(node) for node in nodes)
    out = []
    blocks = [nodes[block * n:(block + 1) * n] for block in range(len(nodes) // n)]
    if topo.levels and link != "intra" and link_level(link) is not None:
        blocks = [[next(node for node in nodes if rank in node) for rank in first.ranks]]
    for members in blocks:
        width = min(len(node) for node in members) if link == "intra" else lanes
        for lane in range(0, width - r + 1, r):
            out.append(Group(link, procs, n, r, tuple(rank for node in members for rank in node[lane:lane + r])))
    return tuple(out)


def groups_per_node(groups: tuple[Group, ...], hosts: list[str]) -> int:
    """The most groups with ranks on any one node (they share its network link)."""
    count: dict[str, int] = {}
    for g in groups:
        for host in {hosts[r] for r in g.ranks}:
            count[host] = count.get(host, 0) + 1
    return max(count.values(), default=0)


def default_procs(world: int) -> list[int]:
    """Powers of two from 2 up to the world size, plus the world size."""
    counts, p = [], 2
    while p <= world:
        counts.append(p)
        p *= 2
    if world >= 2 and world not in counts:
        counts.append(world)
    return counts


def parse_procs(text: str | None, world: int) -> list[int]:
    if text is None:
        return default_procs(world)
    try:
        counts = sorted({int(t) for t in text.split(",")})
    except ValueError:
        raise UsageError(f"malformed process counts {text!r}: expected e.g. 2,4,8") from None
    if not counts or counts[0] < 1:
        raise UsageError(f"process counts must be positive: {text!r}")
    if counts[-1] > world:
        raise UsageError(f"process count {counts[-1]} is larger than the world ({world} ranks)")
    return counts


def parse_links(text: str | None, height: int | None = 1) -> list[str]:
    """--links as link classes, innermost first (default: every class of a topology of `height` switch levels); a
    switch level above `height` is an error (height None: not known yet, any level goes)."""
    if text is None:
        return list(links_for(height or 1))
    links = [t.strip() for t in text.split(",")]
    bad = [link for link in links if not is_link(link)]
    if bad:
        raise UsageError(f"unknown link class {', '.join(map(repr, bad))} in {text!r}; choose from intra, inter, "
                         f"inter2..inter9, spread")
    above = [link for link in links if height is not None and (link_level(link) or 0) > height]
    if above:
        raise UsageError(f"--links {', '.join(above)}: the topology has {height} switch level(s) "
                         f"({'flat' if height == 1 else 'inter..inter' + str(height)}); give the switch tree with "
                         "--topology FILE, or drop it")
    return [link for link in links_for(9) if link in links]
