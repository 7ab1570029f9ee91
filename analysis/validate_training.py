"""The MPI part of `commcal validate --training`: each training configuration (t, p, d, micro-batch, schedule, ZeRO)
run for real on the job's ranks (analysis.harness_pipeline), its numerics checked against one float64 process,
timed by phase in passes over the configurations (analysis.harness.Bench), priced by analysis.training from the
calibration (the model `search` and `predict` use), and scored with validate's ranking metrics; rank 0 writes DIR
(strategies and steps tables, summary.json, run.json) in validate's format."""

from __future__ import annotations

import math
import sys
import numpy as np
import pandas as pd
from mpi4py import MPI

from analysis import ranking
from analysis.harness import TOLERANCE, Bench, NumericsError
from analysis.harness_comm import Collectives, job_mesh
from analysis.harness_exec import Item, Program, Runner
from analysis.harness_pipeline import Place, TrainStep, TransformerStack, reference, unsupported
from analysis.options import nics_per_node, report_fallbacks
from analysis.training import Step, TrainingPricer
from analysis.validate_plan import training_configs
from analysis.validate_run import host_memory, print_metrics, write_run
from microbench import provenance
from microbench.atomic import atomic_write, atomic_write_json
from microbench.backends import backend_for
from microbench.errors import UsageError
from microbench.topology import nodes_of

PARTS = (("compute", ("compute_s", "recompute_s"), ("compute_s",)),
         ("tp", ("tp_comm_s",), ("tp_s",)),
         ("pp+bubble", ("pp_comm_s", "bubble_s"), ("wait_s",)),
         ("dp", ("dp_exposed_s",), ("reduce_s", "overlap_wait_s", "gather_s")),
         ("optimizer", ("optimizer_s",), ("update_s",)))
"""Each part of a step: its predicted columns (analysis.training.Step) and its measured ones (a row's measured_*)."""


def price(args, model, cal, world, hosts) -> tuple[TrainingPricer, list[Step], list[dict]]:
    """(pricer, the predicted steps of the configurations to run, fallbacks): every one runnable and finitely
    priced, else bad input before anything runs."""
    pricer = TrainingPricer(cal, model, world.size, len(nodes_of(hosts)[0]), args.dtype, nics_per_node(args),
                            mixed=False)
    configs = args.configs or [c for c in training_configs(world.size) if pricer.problem(c) is None]
    if not configs:
        raise UsageError(f"no training configuration of {model.name} runs on {world.size} ranks")
    steps = [pricer.price(c) for c in configs]
    for s in steps:
        if unsupported(s.config):
            raise UsageError(f"configuration {s.config}: {unsupported(s.config)}")
        if not s.feasible:
            raise UsageError(f"configuration {s.config} cannot run {model.name}: {s.reason}")
        if not math.isfinite(s.total_s):
            raise UsageError(f"calibration {args.calibration} cannot price configuration {s.config} (a collective "
                             f"or pingpong model is missing on every link class)")
    if cal.backend != args.backend or args.backend != "mpi":
        raise UsageError("validate --training runs on host MPI: --backend mpi and a calibration of that backend")
    fallbacks = report_fallbacks(pricer.fallbacks(), args.calibration, args.strict, world.rank == 0)
    return pricer, steps, fallbacks


def main(args, cfg, model, cal) -> int:
    allocator, pages = host_memory(args, cal)
    world = MPI.COMM_WORLD
    hosts = world.allgather(MPI.Get_processor_name())
    pricer, steps, fallbacks = price(args, model, cal, world, hosts)
    backend = backend_for(args.backend, world, hosts)
    stack = TransformerStack.of(model)
    data = stack.data(args.seed)
    want = reference(stack, data)
    say = print if world.rank == 0 else (lambda *a, **k: None)
    say(f"validate --training: {model.name}, {len(steps)} configurations on {world.size} ranks on "
        f"{len(set(hosts))} host(s); calibration {args.calibration}; host allocator {allocator}, pages {pages}",
        flush=True)
    counters = provenance.cpu_counters()
    runs, colls = [], []
    try:
        for step in steps:
            c = step.config
            mesh, coord, _ = job_mesh(world, f"{c.p}x{c.d}x{c.t}")
            coll = Collectives(world, mesh, coord, backend)
            colls.append(coll)
            train = TrainStep(stack, data, c, Place(*coord, step.micro_batches), coll, backend.xp, args.dtype)
            err = float(coll.world_max(train.errors(data, want)).max())
            if not err <= TOLERANCE[args.dtype]:
                raise NumericsError(f"configuration {c}: max relative error {err:.3g} of outputs and gradients > "
                                    f"{TOLERANCE[args.dtype]:g} against the single-process reference")
            items = tuple(Item(phase, lambda env, run=run: run()) for phase, run in train.phases())
            bench = Bench(Runner(mesh, coord, coll, backend.xp), Program(items, {}, ()))
            bench.max_rel_err = err
            runs.append((step, train, bench))
        say(f"  numerics ok for all {len(runs)} configurations", flush=True)
        visit_rule = cfg.rule.visit(cfg.rounds)
        for _ in range(cfg.rounds):             # passes over the configurations, so that drift hits them alike
            for _, _, bench in runs:
                bench.visit(visit_rule)
        rows = [_row(model, step, train, bench, bench.timed(cfg.rule), world) for step, train, bench in runs]
    except NumericsError as exc:
        if world.rank == 0:
            print(f"commcal: error: numerics mismatch: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        for coll in colls:
            coll.free()
    steal = provenance.host_steal(world, hosts, counters)
    if world.rank == 0:
        _write(args, model, pricer, pd.DataFrame(rows), cal, hosts, steal,
               {"allocator": allocator, "page_policy": pages}, fallbacks)
    return 0


def _row(model, step: Step, train: TrainStep, bench: Bench, timed, world) -> dict:
    """A configuration's predicted and measured step, by part. The pipeline phase's median splits by the clock of
    its busiest device (the most time in passes): compute is that device's share in passes less their tensor-parallel
    collectives, tp the collectives' share, overlap_wait that of waiting for the overlapped gradient all-reduces at
    the end, wait the rest (messages and the bubble on the critical path)."""
    c = step.config
    phase = dict(zip((it.entry.name for it in bench.prog.items), timed.item_median_s))
    shares = np.stack(world.allgather(train.clock.shares()))
    compute, tp, _, dp = shares[int(np.argmax(shares[:, :2].sum(axis=1)))] * phase["pipeline"]
    measured = {"pipeline_s": phase["pipeline"], "compute_s": compute, "tp_s": tp, "overlap_wait_s": dp,
                "p2p_s": float(shares[:, 2].max() * phase["pipeline"]),
                "wait_s": phase["pipeline"] - compute - tp - dp,
                **{f"{k}_s": phase.get(k, 0.0) for k in ("reduce", "update", "gather")}}
    total = timed.total.median
    pred_compute = step.compute_s + step.recompute_s + step.optimizer_s
    return {"layer": model.name, "kind": "training", "strategy": str(c), "selected": "all", **c.to_dict(),
            "micro_batches": step.micro_batches, "predicted_s": step.total_s,
            "predicted_comm_s": step.total_s - pred_compute, "predicted_compute_s": pred_compute,
            **{f"predicted_{k}": getattr(step, k) for k in Step.PARTS},
            "measured_s": total, "measured_ci_low_s": timed.total.ci_low, "measured_ci_high_s": timed.total.ci_high,
            "measured_comm_s": total - compute - measured["update_s"],
            "measured_compute_s": compute + measured["update_s"],
            **{f"measured_{k}": v for k, v in measured.items()},
            "samples": timed.total.samples, "target_met": timed.target_met, "rounds": timed.rounds,
            "round_spread": timed.round_spread, "comm_steps": (c.p > 1) + (c.t > 1) + (c.d > 1),
            "max_rel_err": timed.max_rel_err, "refined": False}


def _write(args, model, pricer: TrainingPricer, frame: pd.DataFrame, cal, hosts, steal, host: dict,
           fallbacks: list[dict]) -> None:
    out = args.out
    frame["accuracy"] = 1 - (frame["predicted_s"] - frame["measured_s"]).abs() / frame["measured_s"]
    comm = frame["measured_comm_s"].where(frame["comm_steps"] > 0)
    frame["comm_accuracy"] = 1 - (frame["predicted_comm_s"] - comm).abs() / comm
    parts = pd.DataFrame([{"layer": r["layer"], "strategy": r["strategy"], "part": part,
                           "predicted_s": sum(r[f"predicted_{k}"] for k in pred),
                           "measured_s": sum(r[f"measured_{k}"] for k in meas)}
                          for r in frame.to_dict("records") for part, pred, meas in PARTS])
    for name, table in (("strategies", frame), ("steps", parts)):
        atomic_write(f"{out}/{name}.parquet", lambda p, t=table: t.to_parquet(p, index=False))
        atomic_write(f"{out}/{name}.csv", lambda p, t=table: t.to_csv(p, index=False))
    m = ranking.flat(ranking.frame_scores(frame, args.top_k, args.bootstrap, args.seed))
    used = parts[parts["predicted_s"] > 0]
    ratios = {part: {"configurations": len(g), "median": float((g["measured_s"] / g["predicted_s"]).median())}
              for part, g in used.groupby("part", sort=False)}
    atomic_write_json(f"{out}/summary.json", {
        "metrics": m, "training": model.name, "calibration": args.calibration,
        "mesh": f"{pricer.devices} devices ({pricer.devices // pricer.gpus_per_node} nodes x {pricer.gpus_per_node})",
        "machine": provenance.machine_name(hosts), "world_size": len(hosts), "hosts": len(set(hosts)),
        "dtype": args.dtype, "date": provenance.now(), "strategies_run": len(frame),
        "targets_met": int(frame["target_met"].sum()), "top_k": args.top_k, "bootstrap": args.bootstrap, **host,
        "part_ratios": ratios, "cpu_steal": steal, "fallbacks": fallbacks,
        "notes": ["one layer: the training step; a strategy: one configuration (t, p, d, micro-batch, schedule, ZeRO)",
                  "metrics without prefix: the whole step; comm_*: the step less compute and the optimizer "
                  "(collectives, point-to-point messages and the bubble)",
                  "part_ratios: median measured / predicted seconds of each part over the configurations that "
                  "have it (pp+bubble measured as the pipeline phase beyond the busiest device's passes)",
                  "ci95: percentile bootstrap over the configurations"]})
    write_run(args, cal, f"{pricer.devices} devices", hosts, steal)
    print(f"validate: wrote {out} ({len(frame)} configurations)")
    print_metrics(m)
    print("  measured / predicted by part: " + ", ".join(f"{k} {v['median']:.2f}" for k, v in ratios.items()))
    print(f"  CPU time taken by the hypervisor (steal): {provenance.steal_text(steal)}")

