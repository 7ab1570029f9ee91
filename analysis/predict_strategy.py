"""`commcal predict CAL --layer SPEC --strategy ID --mesh 2x4 [--json]`: one layer strategy's plan (forward
and backward steps in execution order, with the output resolved P -> B) and its predicted cost.
calib.predict_cmd hooks it: add_arguments(parser) adds --layer/--strategy/--mesh/...; when args.layer is
set, return run_strategy(args, calibration)."""

from __future__ import annotations

import argparse
import json

from analysis.layers import Compute, parse_strategy
from analysis.mesh import parse_mesh
from analysis.models import parse_model
from analysis.pricing import Pricer, after_compute
from analysis.search import Tabulator
from analysis.search_cmd import fmt_bytes, fmt_s, nics_per_node, report_fallbacks
from analysis.summary import chain_steps
from microbench.errors import UsageError
from microbench.ops import GEMM_DTYPES


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("layer strategy (instead of --op)")
    g.add_argument("--layer", default=None, help="layer or model spec, e.g. linear:m=4096,k=8192,n=8192")
    g.add_argument("--strategy", default=None, help="strategy id, one choice per mesh axis, e.g. m.n or -.k/ws")
    g.add_argument("--mesh", default=None, help="device mesh, e.g. 2x4")
    g.add_argument("--ranks-per-node", type=int, default=None, help="ranks per node (default: last axis size)")
    g.add_argument("--devices", type=int, default=None, help="device count the mesh must match")
    g.add_argument("--nics-per-node", type=int, default=1, help="network links per node shared by concurrent groups of a mesh axis (default 1)")
    g.add_argument("--dtype", default="float32", choices=GEMM_DTYPES, help="element type")


def _row(st, after: bool, pricer: Pricer) -> dict:
    if isinstance(st, Compute):
        return {"kind": "compute", "expr": st.expr, "operand_shapes": st.operand_shapes,
                "out_shape": st.out_shape, "flops": st.flops, "seconds": pricer.step_seconds(st)}
    return {"kind": "comm" if st.is_comm else "local", "op": st.op, "axis": st.axis, "link": st.link,
            "after_compute": after,
            "priced_link": pricer.link(st.op, st.axis) if st.is_comm else None, "src": list(map(str, st.src)),
            "dst": list(map(str, st.dst)), "gather_dim": st.gather_dim, "scatter_dim": st.scatter_dim,
            "group_size": st.group_size, "in_shape": st.in_shape, "out_shape": st.out_shape,
            "bytes_per_rank": st.bytes_per_rank, "size_bytes": st.size_bytes, "local_copies": list(st.copies),
            "seconds": pricer.step_seconds(st, after)}


def run_strategy(args: argparse.Namespace, calibration) -> int:
    if not (args.strategy and args.mesh):
        raise UsageError("predict --layer needs --strategy and --mesh")
    mesh = parse_mesh(args.mesh, args.ranks_per_node, args.devices)
    model = parse_model(args.layer, args.dtype)
    if len(model.layers) != 1:
        raise UsageError(f"--layer {args.layer!r} is a model of {len(model.layers)} layers; give one layer")
    layer = model.layers[0]
    strategy = parse_strategy(args.strategy)
    pricer = Pricer(calibration, mesh, args.dtype, nics_per_node(args))
    tables = Tabulator(pricer).tables(model)
    ids = [s.id for s in tables.options[0].strategies]
    if strategy.id not in ids:
        raise UsageError(f"unknown strategy {args.strategy!r} for {type(layer).__name__} on a "
                         f"{len(mesh.shape)}-axis mesh; e.g. {', '.join(ids[:6])}")
    c = ids.index(strategy.id)
    sched = tables.options[0].schedules[c]
    if not sched.feasible:
        raise UsageError(f"strategy {strategy.id} cannot run: {sched.reason}")
    chain = chain_steps(tables, [c])
    parts = [(where, [_row(st, after, pricer) for st, after in zip(steps, after_compute(steps))])
             for where, steps in chain]
    total = sum(r["seconds"] for _, rows in parts for r in rows)
    fallbacks = pricer.fallbacks(st for _, steps in chain for st in steps)
    out = {"layer": args.layer, "strategy": strategy.id, "mesh": str(mesh), "total_s": total,
           "memory_bytes": sched.memory_bytes, "steps": [{"where": w, **r} for w, rows in parts for r in rows],
           "fallbacks": report_fallbacks(fallbacks, args.calibration, args.strict)}
    if getattr(args, "json", False):
        print(json.dumps(out, indent=1))
        return 0
    print(f"{type(layer).__name__} {args.layer} strategy {strategy.id} on mesh {mesh}: {fmt_s(total)}, "
          f"{fmt_bytes(sched.memory_bytes)} per device")
    for where, rows in parts:
        for r in rows:
            if r["kind"] == "compute":
                what = f"{r['expr']}  {' x '.join(map(str, r['operand_shapes']))}"
            else:
                what = (f"{r['op']} axis {r['axis']} ({r['link']}, {r['group_size']} ranks) "
                        f"[{', '.join(r['src'])}] -> [{', '.join(r['dst'])}] {r['bytes_per_rank']} B/rank"
                        + (", after compute" if r["after_compute"] and calibration.after_gemm else ""))
            print(f"  {where:<22} {what}  {fmt_s(r['seconds'])}")
    return 0
