"""`commcal search CAL --model SPEC --mesh 2x4 [--memory-cap 80G] [--top 5] [--json]`: the fastest strategy per
layer (exact by dynamic programming over the chain; SBP, and for a linear layer on a grid-shaped mesh Colossal-AI's
tensor-parallel ones, which are listed beside it), its predicted time split into compute and communication per
collective and link class, the runners-up, and how far coordinate descent lands; for a CNN also ParaDL's network
strategies (analysis.paradl) beside it.
`commcal search CAL --model gpt3-175b --devices 1024 --gpus-per-node 8`: instead of a mesh, the whole space of
training configurations (t, p, d, micro-batch, schedule, ZeRO, SP, recomputation, overlap) and the best few with
their breakdown (analysis.training_view)."""

from __future__ import annotations

import argparse
import time

from analysis.conv import Conv2d
from analysis.mesh import parse_mesh
from analysis.models import check_spec, parse_model
from analysis.paradl import PIPELINE_MICRO_BATCHES, PIPELINE_SCHEDULE, network_table
from analysis.options import (Form, add_json_argument, add_mesh_arguments, add_profile_argument, add_strict_argument,
                              fmt_bytes, fmt_s, form_of, load_profile_argument, nics_per_node, profile_record,
                              report_fallbacks, size_option)
from analysis.pricing import Pricer
from analysis.search import Tabulator, cap_bound, chain_cost, coordinate_descent, memory_of, optimum
from analysis.summary import summarize
from analysis.training_view import add_training_arguments, run_search
from microbench.errors import UsageError
from microbench.jsonfile import strict_json


MAX_RESTARTS = 1000
"""The most coordinate-descent restarts a search runs (each one a full descent over every layer)."""
MESH = Form("layer strategies", ("mesh",), ("ranks_per_node", "devices", "dtype", "nics_per_node", "profile",
                                            "restarts", "cd_window"), (("restarts", 8), ("cd_window", 2)))
TRAINING = Form("a training step", ("devices", "gpus_per_node"), ("dtype", "nics_per_node", "max_micro_batch"),
                (("max_micro_batch", 8),))
"""search's two forms: --devices with --mesh is the count the mesh must match, without it a training step's."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("calibration", help="calibration JSON written by `commcal fit`")
    p.add_argument("--model", required=True, help="preset or layer spec, e.g. gpt-8.3b, vgg13, "
                   "transformer:d=8192,heads=64,layers=96, linear:m=4096,k=8192,n=8192")
    add_mesh_arguments(p, "device mesh axis sizes, e.g. 2x4 (nodes x ranks per node) or 2x2x2 (or, for a training "
                       "step, --devices and --gpus-per-node)", required=False, training=True)
    p.add_argument("--memory-cap", default=None, help="bytes per device, e.g. 80G (binary units)")
    p.add_argument("--top", type=int, default=3, help="runners-up shown per layer (best configurations shown, for "
                   "a training step)")
    p.add_argument("--restarts", type=int, default=None, help="coordinate-descent random restarts (default 8)")
    p.add_argument("--cd-window", type=int, default=None, help="layers coordinate descent re-optimises at once "
                   "(default 2; 1: AutoDDL's one layer at a time)")
    add_json_argument(p)
    add_strict_argument(p)
    add_profile_argument(p)
    add_training_arguments(p, predict=False)


def axis_links(pricer: Pricer) -> list[dict]:
    """Each mesh axis's group shape and the link class (topology level) that prices its collectives."""
    return [{"axis": a.axis, "size": a.size, "nodes": a.nodes, "ranks_per_node": a.ranks_per_node,
             "level": a.level, "link": a.link} for a in pricer.mesh.axes]


def run(args: argparse.Namespace) -> int:
    from calib.calibration import load_calibration

    check_spec(args.model)
    form = form_of(args, "search", (MESH, TRAINING))
    if args.top < 0:
        raise UsageError(f"--top must be >= 0, not {args.top}")
    if form is TRAINING:
        return run_search(args, load_calibration(args.calibration))
    if not 0 <= args.restarts <= MAX_RESTARTS or args.cd_window < 1:
        raise UsageError(f"search takes --restarts 0 to {MAX_RESTARTS} and --cd-window >= 1")
    args.dtype = args.dtype or "float32"
    mesh = parse_mesh(args.mesh, args.ranks_per_node, args.devices)
    model = parse_model(args.model, args.dtype)
    cap = size_option("--memory-cap", args.memory_cap) if args.memory_cap else None
    pricer = Pricer(load_calibration(args.calibration), mesh, args.dtype, nics_per_node(args),
                    load_profile_argument(args))
    t0 = time.perf_counter()
    tab = Tabulator(pricer)
    tables = tab.tables(model)
    bad = [o.layer.name for o in tables.options if not (o.time_s < float("inf")).any()]
    if bad:
        reason = tables.options[[o.layer.name for o in tables.options].index(bad[0])].schedules[0].reason
        reason = reason or "every strategy prices at infinity (the calibration's latencies or rates overflow a double)"
        raise UsageError(f"no strategy of layer {bad[0]} fits mesh {args.mesh}: {reason}")
    choice, lam = optimum(tables, cap)
    if choice is None:
        raise UsageError(f"no strategy assignment fits the memory cap of {args.memory_cap} per device")
    exact_s = time.perf_counter() - t0
    fallbacks = report_fallbacks(pricer.fallbacks(), args.calibration, args.strict)
    profile = profile_record(pricer, [st for o in tables.options for sc in o.schedules for st in sc.steps])
    cd = coordinate_descent(tables, args.restarts, lam=lam, window=args.cd_window)
    cd_total, cd_fits = chain_cost(tables, cd), cap is None or memory_of(tables, cd) <= cap
    taken = "search"
    if lam > 0 and cd_fits and cd_total < chain_cost(tables, choice):
        choice, taken = cd, "coordinate descent"
    out = summarize(tables, choice, pricer, args.top, cap)
    bound = cap_bound(tables, lam, cap) if lam > 0 else out["total_s"]
    network = any(isinstance(layer, Conv2d) for layer in model.layers)
    if network:
        out["paradl"] = network_table(args.model, model, Tabulator(pricer), pricer.cal, args.dtype,
                                      pricer.nics_per_node)
    out.update(model=args.model, mesh=str(mesh), calibration=args.calibration, search_s=exact_s,
               coordinate_descent={"total_s": cd_total, "gap": cd_total / out["total_s"] - 1 if out["total_s"] else 0.0,
                                   "fits_memory_cap": cd_fits},
               optimum={"exact": lam == 0, "bound_s": bound, "taken_from": taken,
                        "gap_bound": out["total_s"] / bound - 1 if bound > 0 else 0.0},
               fallbacks=fallbacks, axes=axis_links(pricer), profile=profile,
               left_out=[{"strategy": k, "why": v} for k, v in sorted(tab.left_out.items())])
    if args.json:
        print(strict_json(out, indent=1))
        return 0
    print(f"model {args.model}: {len(model.layers)} layers on mesh {mesh}; calibration {args.calibration}")
    print("mesh axes: " + "; ".join(f"{a['axis']} ({a['size']}) on {a['link']}" for a in out["axes"]))
    if profile:
        print(f"compute: profile {profile['path']} prices {profile['profiled']} of {profile['compute_steps']} "
              f"compute steps, the calibration's GEMM and copy rates the rest")
    print(f"predicted step time {fmt_s(out['total_s'])} = compute {fmt_s(out['compute_s'])} + communication "
          f"{fmt_s(out['comm_s'])}")
    for key, s in out["comm_by_collective"].items():
        print(f"  {key:<24} {fmt_s(s)}")
    capped = f" (cap {fmt_bytes(cap)})" if cap else ""
    print(f"memory per device {fmt_bytes(out['memory_bytes'])}{capped}")
    print(f"{'layer':<18} {'x':>4} {'strategy':<12} {'time':>10} {'comm':>10} {'compute':>10} {'memory':>11}  runners-up")
    for row in out["layers"]:
        ups = ", ".join(f"{r['strategy']} +{fmt_s(r['extra_s'])}" for r in row["runners_up"])
        print(f"{row['layer']:<18} {row['count']:>4} {row['strategy']:<12} {fmt_s(row['time_s']):>10} "
              f"{fmt_s(row['comm_s']):>10} {fmt_s(row['compute_s']):>10} {fmt_bytes(row['memory_bytes']):>11}  {ups}")
        if row["colossal"]:
            print(f"{'':<18} {'':>4} Colossal-AI: " + ", ".join(f"{r['strategy']} +{fmt_s(r['extra_s'])}"
                                                              for r in row["colossal"]))
    for r in out["left_out"]:
        print(f"not priced: {r['strategy']} ({r['why']})")
    cdr, best = out["coordinate_descent"], out["optimum"]
    cd_line = (f"coordinate descent ({args.restarts} restarts, window {args.cd_window}) {fmt_s(cdr['total_s'])}, "
               + ("over the memory cap" if not cdr["fits_memory_cap"] else
                  f"{100 * cdr['gap']:.2f}% above the " + ("optimum" if best["exact"] else "answer")))
    if best["exact"]:
        print(f"exact search {out['search_s']:.2f} s; {cd_line}")
    else:
        print(f"memory-capped search {out['search_s']:.2f} s (the cap binds: Lagrangian relaxation, the answer at "
              f"most {100 * best['gap_bound']:.2f}% above the fastest assignment within the cap"
              + (", found by coordinate descent" if best["taken_from"] != "search" else "") + f"); {cd_line}")
    if network:
        print("ParaDL's network strategies (every layer alike; pipeline: "
              f"{PIPELINE_MICRO_BATCHES} micro-batches, {PIPELINE_SCHEDULE}):")
        for row in out["paradl"]:
            if row["total_s"] is None:
                print(f"  {row['strategy']:<14} cannot run: {row['reason']}")
                continue
            extra = f"  stages {'+'.join(map(str, row['stages']))} layers" if "stages" in row else ""
            print(f"  {row['strategy']:<14} {fmt_s(row['total_s']):>10}  comm {fmt_s(row['comm_s']):>10}  "
                  f"{row['total_s'] / out['total_s']:.2f}x the searched optimum{extra}")
    return 0
