"""The scan's round-robin schedule: every pair of N nodes exactly once, in rounds of disjoint pairs that run at once,
so a scan takes N-1 rounds (N with an odd N), not N(N-1)/2 pair times. Pure."""

from __future__ import annotations


def round_robin(n: int) -> list[list[tuple[int, int]]]:
    """The circle method: node 0 stays put while the others rotate one place per round; in each round the i-th
    node of the circle meets the i-th from its end. With an odd n a phantom node is added and whoever meets it
    sits the round out (a bye). Pairs are (low, high) node indices; no node is in two pairs of one round."""
    if n < 2:
        return []
    m = n + n % 2
    circle = list(range(m))
    out = []
    for _ in range(m - 1):
        pairs = [(min(a, b), max(a, b)) for a, b in zip(circle[:m // 2], reversed(circle[m // 2:])) if max(a, b) < n]
        out.append(sorted(pairs))
        circle = [circle[0], circle[-1], *circle[1:-1]]
    return out


def round_count(n: int) -> int:
    """How many rounds round_robin(n) has, without building them."""
    return 0 if n < 2 else n - 1 + n % 2
