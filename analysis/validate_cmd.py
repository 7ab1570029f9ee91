"""`commcal validate CAL --layer SPEC [--layer SPEC ...] --mesh 2x2 [--strategies sbp,cai] --out DIR` (under
mpirun/srun): run each layer's strategies (SBP, Colossal-AI's, or those named) for real, check their numerics, time every step, and score the predicted ranking
against the measured one. DIR gets strategies.parquet/.csv (predicted beside measured, one row per layer and
strategy), steps.parquet/.csv (every step), summary.json (metrics with 95% CIs, per layer and overall,
end to end and communication only; the link classes priced by another's models) and run.json (provenance): the
format reports/validation_view.py reads. A collective that no link class of the calibration has a model for is
refused: its prediction would be infinite.

`commcal validate CAL --training MODEL [--config t=..,p=..,d=..,mb=.. ...] --out DIR`: instead of layers, training
configurations of a transformer (pipeline stages on ranks with a real GPipe, 1F1B or interleaved schedule, tensor and
data parallelism, ZeRO 1) run for real and ranked against analysis.training's prices, in the same format
(analysis.validate_training; docs/training.md)."""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from analysis.layers import Layer
from analysis.models import Model, check_spec, parse_model
from analysis.options import (add_dtype_argument, add_nics_argument, add_profile_argument, add_strict_argument,
                              load_profile_argument)
from analysis.strategies import Selection, parse_selection
from microbench.buffers import ALLOCATORS
from microbench.errors import UsageError
from microbench.flags import (BACKEND_HELP, Presets, add_backend_argument, add_quick_argument, add_stop_arguments,
                              check_stop_bounds)
from microbench.jsonfile import directory_kind
from microbench.stats import StopRule
from microbench.threads import LEVELS, choose

QUICK_LAYERS = ("linear:m=64,k=256,n=256", "mlp:batch=64,d_in=64,d_hidden=256",
                "embedding:vocab=256,dim=64,tokens=128,density=0.25")
PRESETS = Presets(
    defaults={"target_ci": 0.02, "budget": 1.0, "min_samples": 10, "max_strategies": 64, "rounds": 3,
              "refine_rounds": 6},
    quick={"target_ci": 0.1, "budget": 0.15, "min_samples": 6, "max_strategies": 16, "refine_rounds": 3})


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("calibration", help="calibration JSON written by `commcal fit`")
    p.add_argument("--layer", action="append", default=[], metavar="SPEC",
                   help="layer or model spec (repeatable), e.g. linear:m=1024,k=1024,n=1024, mlp, "
                        "transformer:d=256,heads=4,seq=64,batch=4, embedding:vocab=4096,dim=256,tokens=1024")
    p.add_argument("--model", action="append", default=[], metavar="SPEC",
                   help="a network (repeatable), e.g. vgg-small or resnet-small, run whole under each of ParaDL's "
                        "strategies that apply on the mesh (data, filter, channel, spatial on a 1-d mesh; data, "
                        "filter, channel, data+filter, data+spatial on a 2-d one): one row per strategy, the network "
                        "forward and backward end to end")
    p.add_argument("--training", default=None, metavar="MODEL",
                   help="validate training configurations of this transformer instead of layers, e.g. "
                        "transformer:d=64,heads=4,layers=8,seq=32,batch=16 (no vocabulary: the blocks only)")
    p.add_argument("--config", action="append", default=[], metavar="CONFIG",
                   help="with --training, a configuration to run (repeatable), as predict --config takes it, e.g. "
                        "t=2,p=2,d=1,mb=1,schedule=1f1b (default: every t x p x d of the ranks with 1F1B and "
                        "micro-batches of 1 and 2, interleaved v=2 where p > 1, ZeRO 1 and DP overlap where d > 1)")
    p.add_argument("--mesh", default=None, help="device mesh, e.g. 2x2; its size must be the world's "
                   "(default: nodes x ranks per node of the job)")
    p.add_argument("--out", required=True, help="output directory")
    add_dtype_argument(p)
    add_backend_argument(p, BACKEND_HELP + " (the calibration must come from a sweep with the same backend)")
    p.add_argument("--thread-level", choices=LEVELS,
                   help="the MPI thread level to ask for (default: MPI4PY_RC_THREAD_LEVEL if set, else the lowest "
                        "the harness needs: single; funneled for the GPU backends); recorded in run.json")
    add_nics_argument(p)
    add_quick_argument(p, f"small default layers ({' '.join(QUICK_LAYERS)}), loose target, short budget")
    add_stop_arguments(p, PRESETS, "a strategy", "time each layer's strategies in this many passes over them, each "
                       "with its share of the budget, pooling the samples, so that the machine's drift over seconds "
                       "does not favour the strategies timed in a quiet window")
    p.add_argument("--budget", type=float, default=None,
                   help=f"seconds per strategy before stopping anyway ({PRESETS.say('budget')})")
    p.add_argument("--refine-rounds", type=int, default=None,
                   help="then this many more passes, each with a round's budget, over each layer's contenders: "
                        "the strategies within --refine-margin of the layer's best, predicted or measured, end to "
                        "end or in communication; they decide top-1 and regret, where a near-tie would otherwise "
                        f"be settled by noise ({PRESETS.say('refine_rounds')}; 0: none)")
    p.add_argument("--refine-margin", type=float, default=0.1,
                   help="contenders are within this fraction of the best (default 0.1)")
    p.add_argument("--allocator", choices=ALLOCATORS, default="cache",
                   help="cache (default): freed host memory stays mapped for reuse, as in a framework's caching "
                        "allocator, so steps do not pay page faults on their new arrays (which the sweep's buffers "
                        "never do); system: the C library's default, which gives large blocks back")
    p.add_argument("--page-policy", choices=("calibration", "hugepage", "nohugepage"), default="calibration",
                   help="huge pages for the harness's numpy arrays (default: the advice the calibration's sweeps "
                        "gave their buffers, so steps and calibration run on the same kind of pages; numpy's "
                        "default where the calibration does not say)")
    p.add_argument("--strategies", default="sbp", metavar="LIST",
                   help="the strategies run: families (sbp: the SBP strategies; cai: Colossal-AI's tensor-parallel "
                        "linear layers cai-1d-col, cai-1d-row, cai-2d, cai-2.5d, cai-3d where the mesh is their grid; "
                        "cai-sbp: each one's SBP equivalent between the same placements, id SBP@cai-KIND) and "
                        "strategy ids, comma-separated, e.g. cai,cai-sbp or cai-2d,m.n/ws (default: sbp); for --model, "
                        "ParaDL's network strategies by name, e.g. data,filter (default: every one that applies on the "
                        "mesh); pipeline (only when named): ParaDL's pipeline over the mesh's devices as stages, run "
                        "on the pipeline executor")
    p.add_argument("--max-strategies", type=int, default=None, help="per layer: above this, run the predicted "
                   "top half plus a seeded random sample of the rest "
                   f"({PRESETS.say('max_strategies')})")
    p.add_argument("--top-k", type=int, default=3, help="k of the top-k overlap metric")
    p.add_argument("--seed", type=int, default=0, help="seed of data, strategy sample and bootstrap")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the CIs")
    add_strict_argument(p)
    add_profile_argument(p)


@dataclass(frozen=True)
class Config:
    rule: StopRule
    max_strategies: int
    rounds: int
    refine_rounds: int
    refine_margin: float
    selection: Selection


def check_out(out: str) -> None:
    """--out, before anything is measured: a directory of its own or an earlier validation's, never a file, a sweep
    run or a scan (whose run.json validate's would replace), and somewhere this process can write: a directory of
    its own made and removed in the nearest existing one (every rank of a job probes at once, so none may touch
    the path itself)."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {out}: exists and is not a directory")
    kind = directory_kind(path) if path.is_dir() else None
    if kind not in (None, "a validation directory"):
        raise UsageError(f"--out {out}: {kind}, which validate's files would replace; give a directory of its own")
    nearest = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".commcal-probe-", dir=nearest))
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write ({exc.strerror or exc})") from None


def config(args) -> Config:
    pick = lambda name: PRESETS.pick(args, name)  # noqa: E731
    target, budget, mins, most = pick("target_ci"), pick("budget"), pick("min_samples"), pick("max_strategies")
    rounds, refine = pick("rounds"), pick("refine_rounds")
    bad = [rule for ok, rule in ((0 < target < 1, "0 < --target-ci < 1"), (budget > 0, "--budget > 0"),
                                 (mins >= 2, "--min-samples >= 2"), (most >= 1, "--max-strategies >= 1"),
                                 (rounds >= 1, "--rounds >= 1"), (refine >= 0, "--refine-rounds >= 0"),
                                 (args.refine_margin >= 0, "--refine-margin >= 0"), (args.top_k >= 1, "--top-k >= 1"),
                                 (args.bootstrap >= 0, "--bootstrap >= 0"), (0 <= args.seed < 2 ** 63,
                                                                             "0 <= --seed < 2^63")) if not ok]
    if bad:
        raise UsageError(f"validate needs {' and '.join(bad)}")
    check_stop_bounds(mins, budget, max(rounds, refine), budget="--budget")
    check_out(args.out)
    if args.training and (args.layer or args.model):
        raise UsageError("give --layer or --model specs or --training MODEL, not both")
    if args.config and not args.training:
        raise UsageError("--config needs --training MODEL")
    if not args.layer and not args.model and not args.quick and not args.training:
        raise UsageError("give at least one --layer SPEC or --model SPEC (or --quick for the quick preset's layers, or "
                         "--training)")
    return Config(StopRule(target_ci=target, min_samples=mins, budget_s=budget), most, rounds, refine,
                  args.refine_margin, parse_selection(args.strategies))


def named_layers(specs, dtype: str) -> list[tuple[str, Layer]]:
    """(unique name, layer) of every layer of every spec: 'kind.layer' (#2, #3 ... on repeats)."""
    out, seen = [], {}
    for spec in specs:
        kind = spec.split(":")[0].strip()
        for layer in parse_model(check_spec(spec), dtype).layers:
            name = f"{kind}.{layer.name}"
            seen[name] = seen.get(name, 0) + 1
            out.append((name if seen[name] == 1 else f"{name}#{seen[name]}", layer))
    return out


def named_networks(specs, dtype: str) -> list[tuple[str, Model]]:
    """(spec, model) of every --model."""
    return [(spec, parse_model(check_spec(spec), dtype)) for spec in specs]


def prepare(args: argparse.Namespace) -> tuple[Config, list[tuple[str, Layer | Model]], object]:
    """(config, named layers and networks, calibration) from the arguments: the checks every rank makes before MPI."""
    from calib.calibration import load_calibration

    layers = named_layers(args.layer or ([] if args.model else QUICK_LAYERS), args.dtype)
    args.profile_data = load_profile_argument(args)
    return config(args), layers + named_networks(args.model, args.dtype), load_calibration(args.calibration)


def prepare_training(args: argparse.Namespace):
    """(config, transformer, calibration) for --training, its configurations parsed into args.configs; a model with a
    vocabulary is refused (the harness runs the blocks)."""
    from analysis.training import Transformer, parse_config
    from calib.calibration import load_calibration

    model = Transformer.parse(check_spec(args.training))
    if model.vocab:
        raise UsageError(f"--training {args.training!r}: the harness runs the transformer's blocks; give vocab=0")
    args.configs = [parse_config(text) for text in args.config]
    return config(args), model, load_calibration(args.calibration)


def run(args: argparse.Namespace) -> int:
    if args.training:
        cfg, model, cal = prepare_training(args)
        args.thread_choice = choose(args.thread_level, args.backend)
        from analysis import validate_training

        return validate_training.main(args, cfg, model, cal)
    cfg, layers, cal = prepare(args)
    args.thread_choice = choose(args.thread_level, args.backend)   # before validate_run initialises MPI
    from analysis import validate_run

    return validate_run.main(args, cfg, layers, cal)
