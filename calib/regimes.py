"""The fit's warning about regime changes the size grid cannot see (microbench.regimes finds them): which intervals,
and which sizes to add to the sweep."""

from __future__ import annotations

from microbench.regimes import HiddenChange


def _span(changes: list[HiddenChange]) -> str:
    """One interval at the process counts where it was found, with its largest time ratio against the size's."""
    c = max(changes, key=lambda x: x.time_ratio)
    procs = ",".join(str(x.procs) for x in changes)
    return f"{c.low_bytes}..{c.high_bytes} B at {procs} ranks (time x{c.time_ratio:.3g} for size x{c.size_ratio:.3g})"


def change_warnings(changes: list[HiddenChange]) -> list[str]:
    """One line per (op, link) naming its intervals and what to do: the sizes to add to the sweep. An interval with
    no size to measure inside is left out: its change is located, and no size is priced by extrapolation there."""
    lines = []
    by_link: dict[tuple[str, str], dict[tuple[int, int], list[HiddenChange]]] = {}
    for c in changes:
        if c.suggest:
            by_link.setdefault((c.op, c.link), {}).setdefault((c.low_bytes, c.high_bytes), []).append(c)
    for (op, link), spans in by_link.items():
        add = ",".join(map(str, sorted({n for cs in spans.values() for c in cs for n in c.suggest})))
        lines.append(f"{op}/{link}: time grows faster than size between adjacent sizes, beyond their CIs, over "
                     f"{'; '.join(_span(cs) for cs in spans.values())}: no alpha-beta line holds across "
                     f"{'it' if len(spans) == 1 else 'them'} (a protocol or algorithm changes inside), so every size "
                     f"inside is priced by extrapolation; measure sizes inside: add {add} to the sweep's --sizes and "
                     f"run it again with --resume (same operations, links and conditions; it measures only the new "
                     f"points), then fit again")
    return lines
