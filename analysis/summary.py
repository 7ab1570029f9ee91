"""What a chosen assignment costs, as data for printing or JSON: the steps it runs (layer schedules,
redistributions between layers, the output's resolution), time split into compute and communication per
collective and link class, memory, and per-layer runners-up (the next best strategies with the others fixed) and, for
a linear layer on a grid-shaped mesh, how its Colossal-AI strategies compare (analysis.colossal)."""

from __future__ import annotations

import re
import numpy as np

from analysis import strategies as tp
from analysis.redistribute import plan
from analysis.search import Tables, chain_cost, memory_of, node_costs, resolved, round_trip


def chain_steps(t: Tables, choice, permute: bool = True) -> list[tuple[str, tuple]]:
    """(where, steps) in execution order: forward through the chain, then backward from the last layer. `permute`:
    activations may reach a layer in the permuted order its stored weight matches (search's plans); False: in
    their canonical order, as the harness runs a whole network (analysis.harness_chain)."""
    mesh, opts = t.mesh, t.options
    sigs = [tp.sigs(o.layer, o.strategies[c]) for o, c in zip(opts, choice)]
    fwd, bwd = [], []
    for i, (o, c, g) in enumerate(zip(opts, choice, sigs)):
        shape, isz, name = o.layer.out_shape, o.layer.itemsize, o.layer.name
        fwd.append((f"{name} forward", o.schedules[c].forward))
        if i + 1 < len(opts):
            nxt = opts[i + 1]
            there, back = round_trip(shape, isz, g.y, sigs[i + 1].x, sigs[i + 1].dx, g.dy,
                                     nxt.layer.PERMUTABLE_INPUT if permute else frozenset(), mesh)
            fwd.append((f"{name} -> {nxt.layer.name}", there.steps))
            grad_in = (f"{nxt.layer.name} -> {name} gradient", back.steps)
        else:
            fwd.append(("output", plan(shape, isz, g.y, resolved(g.y), mesh).steps))
            grad_in = ("output gradient", plan(shape, isz, resolved(g.y), g.dy, mesh).steps)
        bwd = [grad_in, (f"{name} backward", o.schedules[c].backward)] + bwd
    return fwd + bwd


def pattern(name: str) -> str:
    return re.sub(r"block\d+", "block*", name)


def summarize(t: Tables, choice, pricer, top: int = 3, cap: float | None = None) -> dict:
    opts = t.options
    steps = [st for _, sts in chain_steps(t, choice) for st in sts]
    breakdown = pricer.breakdown(steps)
    compute = breakdown.pop("compute", 0.0)
    nodes = node_costs(t, 0.0)
    layers: dict[tuple[str, str], dict] = {}
    for i, (o, c) in enumerate(zip(opts, choice)):
        sid = o.strategies[c].id
        key = (pattern(o.layer.name), sid)
        if key in layers:
            layers[key]["count"] += 1
            continue
        around = nodes[i].copy()
        if i > 0:
            around += t.transitions[i - 1][choice[i - 1], :]
        around += t.transitions[i][:, choice[i + 1]] if i + 1 < len(opts) else t.final
        ranked = [int(j) for j in np.argsort(around, kind="stable") if j != c and np.isfinite(around[j])]
        order = ranked[:top]
        cai = [j for j in ranked if tp.family(o.strategies[j]) == "cai"]
        layers[key] = {"layer": key[0], "kind": type(o.layer).__name__, "count": 1, "strategy": sid,
                       "time_s": float(o.time_s[c]), "comm_s": float(o.comm_s[c]), "compute_s": float(o.compute_s[c]),
                       "memory_bytes": float(o.memory[c]),
                       "runners_up": [{"strategy": o.strategies[j].id, "extra_s": float(around[j] - around[c])}
                                      for j in order],
                       "colossal": [{"strategy": o.strategies[j].id, "extra_s": float(around[j] - around[c])}
                                    for j in cai]}
    return {"total_s": chain_cost(t, np.asarray(choice)), "compute_s": compute,
            "comm_s": float(sum(breakdown.values())), "comm_by_collective": dict(sorted(breakdown.items())),
            "memory_bytes": memory_of(t, choice), "memory_cap_bytes": cap, "layers": list(layers.values())}
