"""The MPI part of `commcal validate`: mesh from the job, pricing by analysis' own Tabulator, the harness on
every rank, then rank 0 scores and writes DIR (atomic writes)."""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np
import pandas as pd
from mpi4py import MPI

from analysis import attribution, ranking, validate_pipeline
from analysis.harness import Bench, NumericsError, layer_data
from analysis.harness_comm import Collectives, job_mesh
from analysis.harness_exec import Runner
from analysis.harness_chain import network_data, network_program
from analysis.layers import Compute
from analysis.models import Model
from analysis.paradl import PIPELINE, PIPELINE_SCHEDULE
from analysis.options import profile_record, report_fallbacks
from analysis.pricing import after_compute
from analysis.validate_plan import contenders, plan
from microbench import memcopy, provenance
from microbench.threads import choose, record
from microbench.errors import UsageError
from microbench.stats import SPEED_GAP
from microbench.backends import backend_for
from microbench.atomic import atomic_write, atomic_write_json
from microbench.buffers import set_page_policy, use_allocator


def host_memory(args, cal) -> tuple[str, str]:
    """(allocator, page policy) the harness's host arrays get, set up as --allocator and --page-policy ask."""
    allocator = use_allocator(args.allocator)
    pages = args.page_policy if args.page_policy != "calibration" else cal.page_policy
    pages = set_page_policy(pages) if pages else set_page_policy("numpy-default") + ", the calibration does not say"
    return allocator, pages


def main(args, cfg, layers, cal) -> int:
    allocator, pages = host_memory(args, cal)
    world = MPI.COMM_WORLD
    mesh, coord, hosts = job_mesh(world, args.mesh)
    pricer, work = plan(args, cfg, layers, cal, mesh)
    pipes = {name: validate_pipeline.predict(args, name, layer, cal, mesh) for name, layer, _, _ in work
             if isinstance(layer, Model) and PIPELINE in cfg.selection.names}
    fallbacks = report_fallbacks(pricer.fallbacks(), args.calibration, args.strict, world.rank == 0)
    profile = profile_record(pricer, [st for _, layer, opts, chosen in work for i, _ in chosen
                                      for st in (opts.steps(i) if isinstance(layer, Model) else opts.schedules[i].steps)],
                             world.rank == 0)
    backend = backend_for(args.backend, world, hosts)
    coll = Collectives(world, mesh, coord, backend)
    runner = Runner(mesh, coord, coll, backend.xp)
    say = print if world.rank == 0 else (lambda *a, **k: None)
    say(f"validate: {len(work)} layer(s) on mesh {mesh}, {world.size} ranks on {len(set(hosts))} host(s); "
        f"calibration {args.calibration}; host allocator {allocator}, pages {pages}", flush=True)
    advice = list(cal.path_advice())
    if profile is None and any(isinstance(layer, Model) for _, layer, _, _ in work):
        advice.append("a network's compute is priced by the calibration's GEMM and copy rates; `commcal profile "
                      "--model SPEC --mesh MESH` measures its kernels, and --profile prices them by that (docs/cnn.md)")
    for line in advice:
        say(f"warning: {line}", flush=True)
    slowdown = memcopy.alias_slowdown() if world.rank == 0 else None
    if slowdown is not None and (warning := memcopy.advice(slowdown)):
        say(f"warning: {warning}", flush=True)
    sharing = provenance.cpu_sharing(world)
    if sharing:
        say(f"warning: {provenance.sharing_text(sharing)}", flush=True)
    rows, steps = [], []
    counters = provenance.cpu_counters()
    try:
        visit_rule = cfg.rule.visit(cfg.rounds)
        for li, (name, layer, opts, chosen) in enumerate(work):
            network = isinstance(layer, Model)
            data = network_data(layer, args.seed + li) if network else layer_data(layer, args.seed + li, args.dtype)
            benches = []
            for i, why in chosen:
                prog = (network_program(runner, opts, i, data, args.dtype) if network
                        else runner.program(layer, opts.schedules[i], data, args.dtype))
                bench = Bench(runner, prog)
                bench.check(args.dtype, f"{'network' if network else 'layer'} {name} strategy {opts.strategies[i].id}")
                benches.append((i, why, bench))
            for _ in range(cfg.rounds):             # passes over the strategies, so that drift hits them alike
                for _, _, bench in benches:
                    bench.visit(visit_rule)
            refined = _refine(world, cfg, opts, benches, visit_rule)
            timings = [bench.timed(cfg.rule) for _, _, bench in benches]
            steals = coll.world_max(np.array([-1.0 if t.cpu_steal is None else t.cpu_steal for t in timings]))
            for (i, why, bench), timed, steal in zip(benches, timings, steals):
                timed = replace(timed, cpu_steal=float(steal) if steal >= 0 else None)   # the most stolen host
                rows.append(_row(name, layer, opts, i, why, bench.prog, timed)
                            | {"refined": i in refined, "sent_bytes": bench.sent_bytes})
                steps += _step_rows(name, opts.strategies[i].id, bench.prog, timed, pricer)
            if chosen:
                say(f"  {name}: {len(chosen)} of {len(opts.strategies)} strategies run, numerics ok"
                    + (f"; {len(refined)} contender(s) refined" if refined else ""), flush=True)
            if name in pipes:
                rows.append(_pipeline_row(args, cfg, name, layer, pipes[name], world, backend))
                say(f"  {name}: {PIPELINE} run, numerics ok", flush=True)
    except NumericsError as exc:
        if world.rank == 0:
            print(f"commcal: error: numerics mismatch: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        coll.free()
    steal = provenance.host_steal(world, hosts, counters)
    if world.rank == 0:
        _write(args, cfg, mesh, hosts, pd.DataFrame(rows), pd.DataFrame(steps, columns=STEP_COLUMNS), cal, steal,
               {"allocator": allocator, "page_policy": pages, "memcpy_alias_slowdown": round(slowdown, 2),
                "cpu_sharing": sharing, "calibration_advice": advice, "profile": profile}, fallbacks)
    return 0


STEP_COLUMNS = ("layer", "strategy", "index", "what", "op", "axis", "link", "size_bytes", "priced_bytes",
                "after_compute", "copy_calls", "copy_elements", "predicted_s", "measured_s")
"""The steps table's columns (_step_rows; a pipeline-only run has no steps). priced_bytes: the size the calibration
was read at (size_bytes times the link's sharing: Pricer.priced_bytes), the size whose sweep speeds judge the step;
copy_calls and copy_elements: the step's local layout copies, priced within predicted_s (so benchmarks.rescore can
price them again)."""


def _pipeline_row(args, cfg, name, model, pipe, world, backend) -> dict:
    """ParaDL's pipeline `pipe` of network `name` on every rank (analysis.validate_pipeline) as a strategy row;
    comm: the step beyond the busiest stage's passes (messages and the bubble)."""
    bench, train = validate_pipeline.bench(args, cfg, model, pipe, world, backend)
    try:
        timed = bench.timed(cfg.rule)
        comm = validate_pipeline.measured_comm(train, timed.total.median, world)
    finally:
        bench.runner.coll.free()
    row = _figures(name, model, PIPELINE, "named", pipe.bubble_s + pipe.messages_s,
                   pipe.total_s - pipe.bubble_s - pipe.messages_s, timed)
    messages = PIPELINE_SCHEDULE.messages(len(pipe.stages), pipe.micro_batches)
    return row | {"comm_steps": int(messages), "measured_comm_s": comm, "measured_compute_s": timed.total.median - comm,
                  "refined": False, "sent_bytes": 0, "stages": "-".join(map(str, pipe.stages))}


def _refine(world, cfg, opts, benches, visit_rule) -> set[int]:
    """Visit the layer's contenders (strategy indices, decided on rank 0 from the pooled rounds) in
    cfg.refine_rounds more passes; returns their indices."""
    if not cfg.refine_rounds:
        return set()
    picked = None
    if world.rank == 0:
        timed = [bench.timed(cfg.rule) for _, _, bench in benches]
        talks = np.array([any(it.is_comm for it in bench.prog.items) for _, _, bench in benches])
        idx = [i for i, _, _ in benches]
        cols = [opts.time_s[idx], np.where(talks, opts.comm_s[idx], np.nan), [t.total.median for t in timed],
                np.where(talks, [t.comm.median for t in timed], np.nan)]
        picked = contenders(cols, cfg.refine_margin)
    picked = world.bcast(picked, root=0)
    for _ in range(cfg.refine_rounds):
        for k in picked:
            benches[k][2].visit(visit_rule)
    return {benches[k][0] for k in picked}


def _row(name, layer, opts, i, why, prog, timed) -> dict:
    """One strategy's predicted and measured figures; comm_bytes: the bytes per rank its collectives' buffers hold
    (sent_bytes, beside it, is what the harness counted)."""
    return _figures(name, layer, opts.strategies[i].id, why, float(opts.comm_s[i]), float(opts.compute_s[i]), timed) \
        | {"comm_steps": sum(it.is_comm for it in prog.items),
           "comm_bytes": sum(it.entry.bytes_per_rank for it in prog.items if it.is_comm)}


def _figures(name, layer, sid, why, comm_s, compute_s, timed) -> dict:
    return {"layer": name, "kind": type(layer).__name__, "strategy": sid, "selected": why,
            "predicted_s": comm_s + compute_s, "predicted_comm_s": comm_s, "predicted_compute_s": compute_s,
            "measured_s": timed.total.median, "measured_ci_low_s": timed.total.ci_low,
            "measured_ci_high_s": timed.total.ci_high, "measured_comm_s": timed.comm.median,
            "measured_compute_s": timed.compute.median, "samples": timed.total.samples,
            "target_met": timed.target_met, "rounds": timed.rounds, "round_spread": timed.round_spread,
            "max_rel_err": timed.max_rel_err, "cpu_steal": timed.cpu_steal}


def _step_rows(name, sid, prog, timed, pricer) -> list[dict]:
    out = []
    entries = [it.entry for it in prog.items]
    for k, (e, after, meas) in enumerate(zip(entries, after_compute(entries), timed.item_median_s)):
        if isinstance(e, Compute):
            out.append({"layer": name, "strategy": sid, "index": k, "what": e.expr, "op": "compute", "axis": -1,
                        "link": "", "size_bytes": 0, "priced_bytes": 0, "after_compute": after, "copy_calls": 0,
                        "copy_elements": 0, "predicted_s": pricer.step_seconds(e), "measured_s": meas})
            continue
        priced = float(pricer.priced_bytes(e.op, e.axis, float(e.size_bytes))) if e.is_comm else e.size_bytes
        out.append({"layer": name, "strategy": sid, "index": k, "what": e.describe(), "op": e.op, "axis": e.axis,
                    "link": e.link, "size_bytes": e.size_bytes, "priced_bytes": priced, "after_compute": after,
                    "copy_calls": len(e.copies), "copy_elements": sum(e.copies),
                    "predicted_s": pricer.step_seconds(e, after), "measured_s": meas})
    return out


def _write(args, cfg, mesh, hosts, frame: pd.DataFrame, steps: pd.DataFrame, cal, steal: dict, host: dict,
           fallbacks: list[dict]) -> None:
    """The tables, summary.json and run.json (rank 0); `host`: allocator, page_policy and memcpy_alias_slowdown for
    the summary; `fallbacks`: report_fallbacks' records."""
    out = args.out
    frame["accuracy"] = 1 - (frame["predicted_s"] - frame["measured_s"]).abs() / frame["measured_s"]
    comm = frame["measured_comm_s"].where(frame["comm_steps"] > 0)
    frame["comm_accuracy"] = 1 - (frame["predicted_comm_s"] - comm).abs() / comm
    for name, table in (("strategies", frame), ("steps", steps)):
        atomic_write(f"{out}/{name}.parquet", lambda p, t=table: t.to_parquet(p, index=False))
        atomic_write(f"{out}/{name}.csv", lambda p, t=table: t.to_csv(p, index=False))
    m = ranking.flat(ranking.frame_scores(frame, args.top_k, args.bootstrap, args.seed))
    per_layer = {name: ranking.flat(ranking.frame_scores(g, args.top_k, args.bootstrap, args.seed))
                 for name, g in frame.groupby("layer", sort=False)}
    by_link = attribution.link_accuracy(frame, steps, args.bootstrap, args.seed)
    ratios = attribution.step_ratios(steps, cal.several_speeds())
    slow = attribution.slow_launch(ratios)
    machine = provenance.machine_name(hosts)
    atomic_write_json(f"{out}/summary.json", {
        "metrics": m, "calibration": args.calibration, "mesh": str(mesh), "machine": machine,
        "world_size": len(hosts), "hosts": len(set(hosts)), "dtype": args.dtype, "date": provenance.now(),
        "strategies_run": len(frame), "layers_run": int(frame["layer"].nunique()),
        "targets_met": int(frame["target_met"].sum()), "top_k": args.top_k, "bootstrap": args.bootstrap,
        **host,
        "refine": {"rounds": cfg.refine_rounds, "margin": cfg.refine_margin, "strategies": int(frame["refined"].sum())},
        "layers": per_layer, "by_link": by_link, "step_ratios": ratios, "slow_launch": slow, "cpu_steal": steal,
        "fallbacks": fallbacks,
        "notes": ["metrics without prefix: end to end (forward + backward); comm_*: communication time only, "
                  "over strategies that communicate", "ci95: percentile bootstrap over each layer's strategies",
                  f"resolved_tau: Kendall's tau over the strategy pairs measured more than {ranking.RESOLUTION:.0%} of "
                  "the faster apart (a predicted tie counting against the model); absent where no layer has such "
                  "a pair",
                  "by_link: comm mean accuracy over the strategies whose collectives spent most of their measured "
                  "time on that link class; step_ratios: measured / predicted time of each collective's steps "
                  f"(with slow_steps, those over {1 + SPEED_GAP:.2f}x, where the calibration priced the fast one of "
                  "several speeds its sweep saw, up to sweep_slow_ratio) and verdict: priced (within "
                  f"{attribution.OFF_PRICE:.0%}), slow_speed (at a slow speed the calibration records), slower or "
                  "faster (off the price otherwise)",
                  "slow_launch: every collective's verdict is slower or slow_speed: the launch ran slow throughout; a "
                  "second validate tells a slow launch from a calibration that prices too fast",
                  "cpu_steal: per host, the share of CPU time a hypervisor gave other guests while validate ran "
                  "(null: unknown)", "allocator: cache, freed host memory stayed mapped for reuse (no page faults "
                  "on a step's new arrays); system: the C library's default",
                  "page_policy: huge-page advice of the harness's numpy arrays (validate --page-policy)",
                  "profile: the compute profile (validate --profile) and how many of the run's compute steps it "
                  "priced; the others, and every step without one, by the calibration's GEMM and copy rates",
                  "fallbacks: collectives priced by another link class's models than their mesh axis's (wanted), "
                  "which the calibration lacks",
                  "calibration_advice: ways the calibration was made that are known to rank strategies worse than "
                  "the default path (a quick preset, one MPI launch between nodes, no after-compute models), and a "
                  "network's compute priced without a compute profile",
                  "cpu_sharing: where ranks outnumbered the CPUs of one machine, the most ranks and the CPUs they "
                  "shared (null: a CPU per rank); their steps then run over their price by scheduling alone",
                  "memcpy_alias_slowdown: how many times slower a 128 KiB host copy ran with its destination 16 B "
                  "past its source modulo 4 KiB than 2 KiB past (microbench.memcopy); above 2, step times depend "
                  "on where buffers lie"]})
    write_run(args, cal, str(mesh), hosts, steal)
    print(f"validate: wrote {out} ({len(frame)} strategies)")
    print_metrics(m)
    print(attribution.describe(by_link, ratios))
    if slow:
        print(f"warning: every collective ran more than {attribution.OFF_PRICE:.0%} slower than its price: this launch "
              "ran slow throughout (a slow mode for the whole launch, other load), or the calibration prices too fast; "
              "validate again, and judge the calibration by a launch that does not "
              "(docs/troubleshooting.md#a-validate-slower-than-priced-throughout)")
    print(f"  CPU time taken by the hypervisor (steal): {provenance.steal_text(steal)}")



def write_run(args, cal, mesh: str, hosts: list[str], steal: dict) -> None:
    """DIR/run.json: the validation's provenance (rank 0)."""
    atomic_write_json(f"{args.out}/run.json", {
        "command": "validate", "argv": sys.argv, "calibration": args.calibration, "calibration_backend": cal.backend,
        "mesh": mesh, "hosts": hosts, "machine": provenance.machine_name(hosts), "date": provenance.now(),
        "cpu": provenance.cpu_model(), "mpi_library_version": provenance.mpi_library_version(),
        "versions": provenance.software_versions(), "environment": provenance.relevant_environment(),
        "cpu_steal": steal, "mpi_thread_level": record(getattr(args, "thread_choice", None) or choose(None))})


def print_metrics(m: dict) -> None:
    """The headline ranking metrics of a flat metrics dict, end to end and communication only."""
    for key in ("kendall_tau", "resolved_tau", "top1", "regret", "mean_accuracy"):
        for pre in ("", "comm_"):
            if pre + key in m:
                print(f"  {(pre or 'total_') + key:<22} {ranking.text(m[pre + key])}")
