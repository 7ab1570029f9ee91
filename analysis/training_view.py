"""What `commcal search --devices N --gpus-per-node G` and `commcal predict --config` share: their flags, the
machine they price on (a calib Calibration, the model, devices, memory per device), and how a training step's
breakdown prints, as text or JSON."""

from __future__ import annotations

import argparse
import time

from analysis.options import fmt_bytes, fmt_s, nics_per_node, report_fallbacks, size_option
from analysis.models import check_spec, parse_spec
from analysis.training import Step, StepPricer, TrainingPricer, Transformer, parse_config
from analysis.training_chain import Chain, ChainTrainingPricer
from microbench.errors import UsageError
from microbench.jsonfile import strict_json
from microbench.limits import MAX_RANKS


def add_training_arguments(p: argparse.ArgumentParser, predict: bool) -> None:
    g = p.add_argument_group("training step (pipeline, tensor and data parallelism, ZeRO, SP, recomputation)")
    if predict:
        g.add_argument("--model", default=None, help="model preset or spec: a transformer (e.g. gpt3-175b or "
                       "transformer:d=6144,heads=64,layers=48,seq=2048,batch=4,vocab=51200) or a chain of layers "
                       "(e.g. vgg13, vgg-small, mlp:batch=512)")
        g.add_argument("--config", action="append", default=None, help="one configuration, e.g. t=8,p=8,d=16,mb=1,"
                       "schedule=interleaved,v=3,zero=1,sp=1,recompute=selective,overlap=1")
    else:
        g.add_argument("--max-micro-batch", type=int, default=None, help="largest micro-batch size searched "
                       "(default 8)")
    g.add_argument("--gpus-per-node", type=int, default=None, help="devices per node (with --devices: a training "
                   "step instead of a layer mesh)")


def pricer_of(args: argparse.Namespace, calibration) -> StepPricer:
    """The training pricer the flags describe (a transformer's, else a chain's); the device memory is --memory-cap,
    else the calibration's. Nodes are never wider than the job (--gpus-per-node at most --devices)."""
    if not 1 <= args.devices <= MAX_RANKS:
        raise UsageError(f"--devices {args.devices}: a training step takes 1 to {MAX_RANKS} devices")
    if args.gpus_per_node > args.devices:
        raise UsageError(f"--gpus-per-node {args.gpus_per_node} is more than --devices {args.devices}")
    dtype = args.dtype or max(calibration.result.gemm, key=lambda d: calibration.result.gemm[d].flops_per_s,
                              default="float32")
    cap = (size_option("--memory-cap", args.memory_cap) if getattr(args, "memory_cap", None)
           else calibration.memory_bytes())
    transformer = parse_spec(args.model)[0] == "transformer"
    model = Transformer.parse(args.model) if transformer else Chain.parse(args.model, dtype)
    cls = TrainingPricer if transformer else ChainTrainingPricer
    return cls(calibration, model, args.devices, args.gpus_per_node, dtype, nics_per_node(args), cap)


def _head(tp: StepPricer, calibration, path: str) -> dict:
    spec = calibration.spec()
    m = tp.model
    runs = calibration.result.provenance.get("runs", [])
    refined = [str(r.get("run_id", "?")) for r in runs if spec and "spec" not in r.get("origin", {})]
    return {"model": m.name, "parameters": m.params, "devices": tp.devices, "gpus_per_node": tp.gpus_per_node,
            "calibration": path, "spec": spec["file"] if spec else None, "refined_by": refined, "dtype": tp.dtype,
            "memory_per_device_bytes": tp.memory_bytes}


def _print_head(head: dict) -> None:
    refined = f", refined by {len(head['refined_by'])} measured run(s)" if head["refined_by"] else ""
    origin = f" (from the spec {head['spec']}{refined})" if head["spec"] else ""
    cap = fmt_bytes(head["memory_per_device_bytes"]) if head["memory_per_device_bytes"] else "unknown (unchecked)"
    print(f"model {head['model']}: {head['parameters'] / 1e9:.4g}B parameters on {head['devices']} devices, "
          f"{head['gpus_per_node']} per node; calibration {head['calibration']}{origin}; {head['dtype']}; "
          f"memory per device {cap}")


COLUMNS = (("step", "total_s"), ("compute", "compute_s"), ("recomp", "recompute_s"), ("tp", "tp_comm_s"),
           ("pp", "pp_comm_s"), ("bubble", "bubble_s"), ("dp", "dp_exposed_s"), ("dp hid", "dp_overlapped_s"),
           ("optim", "optimizer_s"))


def _table(steps: list[Step]) -> None:
    print(f"{'#':>3} {'configuration':<56} {'m':>5}" + "".join(f" {name:>10}" for name, _ in COLUMNS)
          + f" {'memory':>11}  links")
    for i, s in enumerate(steps, 1):
        links = ", ".join(f"{k} {v}" for k, v in s.links.items())
        print(f"{i:>3} {str(s.config):<56} {s.micro_batches:>5}"
              + "".join(f" {fmt_s(getattr(s, key)) if getattr(s, key) else '-':>10}" for _, key in COLUMNS)
              + f" {fmt_bytes(s.memory.total):>11}  {links}")


def run_search(args: argparse.Namespace, calibration) -> int:
    if args.max_micro_batch < 1:
        raise UsageError("--max-micro-batch must be at least 1")
    tp = pricer_of(args, calibration)
    t0 = time.perf_counter()
    steps = [tp.price(c) for c in tp.space(args.max_micro_batch)]
    elapsed = time.perf_counter() - t0
    ok = sorted((s for s in steps if s.feasible), key=lambda s: s.total_s)
    over = sum(1 for s in steps if not s.feasible and s.memory is not None)
    others = [s.reason for s in steps if not s.feasible and s.memory is None]
    fallbacks = report_fallbacks(tp.fallbacks(), args.calibration, args.strict)
    if not steps:
        m = tp.model
        raise UsageError(f"no configuration of {m.name} fits {tp.devices} devices: no split t x p x d of them with t "
                         f"dividing its {m.heads} heads and {m.ffn} ffn, p its {m.layers} layers and d its batch of "
                         f"{m.batch}")
    if not ok:
        why = f"{over} over device memory" + (f"; e.g. {others[0]}" if others else "")
        raise UsageError(f"no configuration of {tp.model.name} fits {tp.devices} devices ({len(steps)} tried: {why})")
    best = ok[:args.top]
    out = {**_head(tp, calibration, args.calibration), "evaluated": len(steps), "feasible": len(ok),
           "over_memory": over, "other_infeasible": len(others), "search_s": elapsed,
           "best": [s.to_dict() for s in best], "fallbacks": fallbacks}
    if args.json:
        print(strict_json(out, indent=1))
        return 0
    _print_head(out)
    print(f"searched {len(steps):,} configurations in {elapsed:.2f} s: {len(ok):,} feasible, {over:,} over device "
          f"memory, {len(others):,} otherwise infeasible; best {len(best)}:")
    _table(best)
    print("step = compute + recomp + tp + pp + bubble + dp (exposed) + optim; dp hid: data-parallel time hidden "
          "behind the backward pass")
    return 0


def run_predict(args: argparse.Namespace, calibration) -> int:
    if len(args.config) > 1:
        raise UsageError("give --config once: predict prices one configuration (search --devices --gpus-per-node "
                         "searches them all)")
    check_spec(args.model)
    tp = pricer_of(args, calibration)
    step = tp.price(parse_config(args.config[0]))
    fallbacks = report_fallbacks(tp.fallbacks(), args.calibration, args.strict)
    if not step.feasible and step.memory is None:
        raise UsageError(f"configuration {step.config} cannot run: {step.reason}")
    out = {**_head(tp, calibration, args.calibration), **step.to_dict(), "fallbacks": fallbacks}
    if args.json:
        print(strict_json(out, indent=1))
        return 0
    _print_head(out)
    if not step.feasible:
        print(f"infeasible: {step.reason}")
    else:
        _table([step])
    mem = step.memory
    print(f"memory per device: parameters {fmt_bytes(mem.params)}, gradients {fmt_bytes(mem.grads)}, optimizer "
          f"{fmt_bytes(mem.optimizer)}, activations {fmt_bytes(mem.activations)}")
    return 0
