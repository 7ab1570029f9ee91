"""`commcal predict CAL --op OP --link LINK --procs P --bytes SIZE [--after-compute] [--json]`: one predicted time
with its 95% interval, saying when it extrapolates beyond what was measured. With --layer/--strategy/--mesh instead
of --op, the plan and cost of one layer strategy: its forward and backward steps in execution order, with the
output resolved P -> B (run_strategy). With --model/--config/--devices/--gpus-per-node, one training step's
breakdown and memory (analysis.training_view)."""

from __future__ import annotations

import argparse

from analysis.colossal import Rooted
from analysis.layers import Compute, parse_strategy
from analysis.mesh import parse_mesh
from analysis.models import check_spec, parse_model
from analysis.options import (Form, add_json_argument, add_mesh_arguments, add_profile_argument, add_strict_argument,
                              fmt_bytes, fmt_s, form_of, load_profile_argument, nics_per_node, profile_record,
                              report_fallbacks, size_option)
from analysis.pricing import Fallback, Pricer, after_compute, resolve
from analysis.search import Tabulator
from analysis.summary import chain_steps
from analysis.training_view import add_training_arguments, run_predict
from calib.calibration import load_calibration
from microbench.errors import UsageError
from microbench.jsonfile import strict_json
from microbench.limits import MAX_RANKS
from microbench.links import is_link
from microbench.ops import LOCAL_OPS, OPS
from microbench.sizes import format_size

TRAINING = Form("a training step", ("model", "config", "devices", "gpus_per_node"), ("dtype", "nics_per_node"))
LAYER = Form("a layer strategy", ("layer", "strategy", "mesh"),
             ("ranks_per_node", "devices", "dtype", "nics_per_node", "profile"))
COLLECTIVE = Form("a collective", ("op", "link", "procs", "bytes"), ("after_compute",))
FORMS = (COLLECTIVE, LAYER, TRAINING)
"""predict's three forms, the first chosen where flags of several are given (and the others' then refused)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("calibration", help="calibration JSON written by `commcal fit`")
    p.add_argument("--op", help="operation, e.g. allreduce, allgather, pingpong")
    p.add_argument("--link", help="link class: intra, inter, inter2..inter9 (switch levels), spread")
    p.add_argument("--procs", type=int, help="process count")
    p.add_argument("--bytes", help="size in the nccl-tests convention, e.g. 64M")
    p.add_argument("--after-compute", action="store_true",
                   help="the call directly follows a local computation: price it by the calibration's after-compute "
                        "model where it has one (commcal fit --after-compute)")
    add_json_argument(p)
    add_strategy_arguments(p)
    add_strict_argument(p)
    add_training_arguments(p, predict=True)


def run(args: argparse.Namespace) -> int:
    form = form_of(args, "predict", FORMS)
    cal = load_calibration(args.calibration)
    if form is TRAINING:
        return run_predict(args, cal)
    if form is LAYER:
        return run_strategy(args, cal)
    if args.op in LOCAL_OPS:
        raise UsageError(f"--op {args.op}: predict prices communication; {args.op} is a local operation, whose "
                         f"rates are the calibration's compute.{args.op}")
    if args.op not in OPS:
        raise UsageError(f"--op {args.op!r} is not an operation; predict prices "
                         f"{', '.join(op for op in OPS if op not in LOCAL_OPS)}")
    if not is_link(args.link):
        raise UsageError(f"--link {args.link!r} is not a link class (intra, inter, inter2..inter9, spread)")
    least = 2 if OPS[args.op].kind == "p2p" else 1
    if not least <= args.procs <= MAX_RANKS:
        raise UsageError(f"--procs {args.procs}: {args.op} takes {least} to {MAX_RANKS} processes")
    nbytes = size_option("--bytes", args.bytes)
    if args.after_compute and not cal.after_gemm:
        raise UsageError(f"{args.calibration} has no after-compute models (fit with --after-compute RUN_DIR)")
    link = resolve(cal, args.op, args.link) or args.link        # absent everywhere: predict names what it has
    pred = cal.predict(args.op, link, args.procs, nbytes, args.after_compute)
    fallbacks = [Fallback(args.op, None, args.link, link)] if link != args.link else []
    fallbacks = report_fallbacks(fallbacks, args.calibration, args.strict)
    if args.json:
        print(strict_json({"op": args.op, "procs": args.procs, "bytes": nbytes, **pred.to_dict(),
                          "fallbacks": fallbacks}))
        return 0
    via = f" (by its {link} model)" if link != args.link else ""
    print(f"{args.op} on {args.link}{via}, p={args.procs}, {format_size(nbytes)}B: {fmt_s(pred.seconds)} "
          f"(95% interval {fmt_s(pred.low_s)} .. {fmt_s(pred.high_s)}; {pred.model} model)")
    if pred.note:
        print(f"note: {pred.note}")
    return 0


def add_strategy_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("layer strategy (instead of --op)")
    g.add_argument("--layer", default=None, help="layer or model spec, e.g. linear:m=4096,k=8192,n=8192")
    g.add_argument("--strategy", default=None, help="strategy id, one choice per mesh axis, e.g. m.n or -.k/ws, or "
                   "a Colossal-AI one on its grid, e.g. cai-2d (docs/tensor-parallel.md)")
    add_mesh_arguments(g, "device mesh, e.g. 2x4", required=False, training=True)
    add_profile_argument(g)


def _row(st, after: bool, pricer: Pricer) -> dict:
    if isinstance(st, Compute):
        return {"kind": "compute", "expr": st.expr, "operand_shapes": st.operand_shapes,
                "out_shape": st.out_shape, "flops": st.flops, "seconds": pricer.step_seconds(st),
                "profiled": pricer.profiled([st])[0] == 1}
    if isinstance(st, Rooted):
        return {"kind": "comm", "op": st.op, "axis": st.axis, "link": st.link, "after_compute": after,
                "priced_link": pricer.link(st.op, st.axis), "root": st.root, "what": st.what,
                "group_size": st.group_size, "shape": st.shape, "bytes_per_rank": st.bytes_per_rank,
                "size_bytes": st.size_bytes, "seconds": pricer.step_seconds(st, after)}
    return {"kind": "comm" if st.is_comm else "local", "op": st.op, "axis": st.axis, "link": st.link,
            "after_compute": after,
            "priced_link": pricer.link(st.op, st.axis) if st.is_comm else None, "src": list(map(str, st.src)),
            "dst": list(map(str, st.dst)), "gather_dim": st.gather_dim, "scatter_dim": st.scatter_dim,
            "group_size": st.group_size, "in_shape": st.in_shape, "out_shape": st.out_shape,
            "bytes_per_rank": st.bytes_per_rank, "size_bytes": st.size_bytes, "local_copies": list(st.copies),
            "seconds": pricer.step_seconds(st, after)}


def run_strategy(args: argparse.Namespace, calibration) -> int:
    mesh = parse_mesh(args.mesh, args.ranks_per_node, args.devices)
    dtype = args.dtype or "float32"
    model = parse_model(check_spec(args.layer), dtype)
    if len(model.layers) != 1:
        raise UsageError(f"--layer {args.layer!r} is a model of {len(model.layers)} layers; give one layer")
    layer = model.layers[0]
    strategy = parse_strategy(args.strategy)
    pricer = Pricer(calibration, mesh, dtype, nics_per_node(args), load_profile_argument(args))
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
           "fallbacks": report_fallbacks(fallbacks, args.calibration, args.strict),
           "profile": profile_record(pricer, [st for _, steps in chain for st in steps])}
    if getattr(args, "json", False):
        print(strict_json(out, indent=1))
        return 0
    print(f"{type(layer).__name__} {args.layer} strategy {strategy.id} on mesh {mesh}: {fmt_s(total)}, "
          f"{fmt_bytes(sched.memory_bytes)} per device")
    for where, rows in parts:
        for r in rows:
            if r["kind"] == "compute":
                what = (f"{r['expr']}  {' x '.join(map(str, r['operand_shapes']))}"
                        + ("  (profiled)" if r["profiled"] else ""))
            elif "root" in r:
                what = (f"{r['op']} axis {r['axis']} ({r['link']}, {r['group_size']} ranks) {r['what']} "
                        f"{'from' if r['op'] == 'bcast' else 'to'} member {r['root']} {r['bytes_per_rank']} B/rank")
            else:
                what = (f"{r['op']} axis {r['axis']} ({r['link']}, {r['group_size']} ranks) "
                        f"[{', '.join(r['src'])}] -> [{', '.join(r['dst'])}] {r['bytes_per_rank']} B/rank"
                        + (", after compute" if r["after_compute"] and calibration.after_gemm else ""))
            print(f"  {where:<22} {what}  {fmt_s(r['seconds'])}")
    return 0
