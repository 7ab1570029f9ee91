"""Benchmark: does a machine's calibration rank strategies the way reality does? Sweeps the collectives
(intra and inter links, 2 ranks each), fits a calibration, validates communication-heavy layers on mesh
2x2, and prints the figures against issue 6's targets. On the local cluster (2 nodes x 2 ranks):

    slurm/cluster.sh up --nodes 2 --rate 400mbit --no-slurm
    python -m benchmarks.validate --launch "slurm/cluster.sh mpirun -n 4 --host node1:2,node2:2" --out /tmp/bv
    slurm/cluster.sh down

Besides the plain sweep, a second sweep runs every collective right after a --after-gemm N x N GEMM (default
384; 0: none), and the fit turns it into the after-compute models that price the collectives of a training step
that follow a computation. --calibration CAL skips the sweeps and the fit. --repeat N validates N times
(DIR/validate, DIR/validate-2, ...) and also scores each run's measured times as the prediction of another's: the
figures no cost model can beat on a machine whose measurements repeat only that well. --mesh 2 runs a control
with one rank per core on one link class: 2 ranks on one node with --links intra, or one on each of two nodes
with --links inter."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from itertools import permutations
from pathlib import Path

import pandas as pd

from analysis import attribution, ranking
from microbench import provenance
from benchmarks import benchmark_parser

LAYERS = ("linear:m=256,k=1024,n=1024", "mlp:batch=256,d_in=512,d_hidden=1024",
          "embedding:vocab=8192,dim=256,tokens=1024,density=0.05")
SWEEP = ["--ops", "allreduce,allgather,reduce_scatter,alltoall,gemm,copy", "--procs", "2",
         "--sizes", "1K:16M", "--gemm-sizes", "256K,1M,4M", "--target-ci", "0.05", "--point-budget", "0.3",
         "--retries", "4"]
# The ranking targets; comm_resolved_tau holds comm Kendall tau's to the pairs measured more than the regret
# target apart (analysis.ranking.RESOLUTION is that target, defined once).
TARGETS = (("comm_kendall_tau", ">=", 0.9), ("comm_resolved_tau", ">=", 0.9), ("comm_regret", "<=", ranking.RESOLUTION),
           ("comm_mean_accuracy", ">=", 0.95))


def _run(argv: list[str]) -> None:
    print("$", shlex.join(argv), flush=True)
    t0 = time.monotonic()
    subprocess.run(argv, check=True)
    print(f"  ({time.monotonic() - t0:.0f} s)", flush=True)


def _print(columns: dict[str, dict]) -> None:
    """One row per metric, one column per run ("run i", with the 95% CI when there is one run) or per repeat
    ("i as j": run i's measured times scored as the prediction of run j's), then the target."""
    names = next(iter(columns.values()))
    one = len(columns) == 1
    print(f"{'metric':<26} " + " ".join(f"{c:>9}" for c in columns) + ("  95% CI             " if one else "")
          + "  target")
    for name in sorted(names, key=lambda n: (not n.startswith("comm_"), n)):
        values = [m[name]["value"] if name in m else float("nan") for m in columns.values()]
        ci = names[name]["ci95"]
        cis = (f"  [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "").ljust(21) if one else ""
        target = next((f"{op} {t:g}  " + " ".join("MET" if (v >= t if op == ">=" else v <= t) else "missed"
                                                  for v, c in zip(values, columns) if c.startswith("run"))
                       for n, op, t in TARGETS if n == name), "")
        print(f"{name:<26} " + " ".join(f"{v:>9.4f}" for v in values) + f"{cis}  {target}")


def score_runs(runs: list[Path]) -> tuple[list[dict], dict[str, dict], list[pd.DataFrame]]:
    """(summaries, columns for _print, strategies tables) of validate directories: each run's metrics, and each run's
    measured times scored as the prediction of each other's."""
    summaries = [json.loads((run / "summary.json").read_text()) for run in runs]
    columns = {f"run {i + 1}": s["metrics"] for i, s in enumerate(summaries)}
    tables = [pd.read_parquet(run / "strategies.parquet") for run in runs]
    for a, b in permutations(range(len(runs)), 2):
        repeat = ranking.repeat_frame(tables[a], tables[b])
        columns[f"{a + 1} as {b + 1}"] = ranking.flat(ranking.frame_scores(repeat, 3, 1000, 0))
    return summaries, columns, tables


def main(argv=None) -> int:
    return guarded(_bench, argv, "bench_validate")


def calibrate(sweep: list[str], after_gemm: int, out: Path) -> str:
    """OUT/calibration.json fitted from the `sweep` command's run, plus (after_gemm > 0) a second run with an
    after_gemm x after_gemm GEMM before each call for the after-compute models; returns its path."""
    cal = str(out / "calibration.json")
    _run([*sweep, "--out", str(out / "sweep")])
    after = []
    if after_gemm:
        _run([*sweep, "--out", str(out / "sweep-after"), "--after-gemm", str(after_gemm)])
        after = ["--after-compute", str(out / "sweep-after")]
    _run([sys.executable, "-m", "reports.cli", "fit", str(out / "sweep"), *after, "--out", cal])
    return cal


def guarded(bench, argv, name: str) -> int:
    """bench(argv), a failed step ending it with one line naming that command and its exit code (2 stays 2)."""
    try:
        return bench(argv)
    except subprocess.CalledProcessError as e:
        print(f"{name}: {shlex.join(map(str, e.cmd))} exited {e.returncode}", file=sys.stderr)
        return 2 if e.returncode == 2 else 1


def add_common_arguments(p: argparse.ArgumentParser, launch: str, links: str, repeat: int) -> None:
    """The flags every ranking benchmark takes: launcher, output, calibration, links to sweep, validate's extra
    arguments and the repeat count (defaults `links` and `repeat`)."""
    p.add_argument("--launch", required=True, help=f"MPI launcher prefix ({launch})")
    p.add_argument("--out", required=True)
    p.add_argument("--calibration", help="use this calibration (skip sweep and fit)")
    p.add_argument("--links", default=links, help="link classes to sweep (intra alone on one host)")
    p.add_argument("--validate-args", default="", help="more `commcal validate` arguments")
    p.add_argument("--repeat", type=int, default=repeat, help=f"validate this many times (default {repeat})")


def parse_common(p: argparse.ArgumentParser, argv) -> tuple[argparse.Namespace, Path, list[str], list[str]]:
    """(arguments, output directory, the commcal command, the launcher) of a ranking benchmark."""
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    return args, Path(args.out), [sys.executable, "-m", "reports.cli"], shlex.split(args.launch)


def _bench(argv) -> int:
    p = benchmark_parser("benchmarks.validate", __doc__)
    add_common_arguments(p, "4 ranks on 2 nodes for mesh 2x2", "intra,inter", 1)
    p.add_argument("--sweep-args", default="", help="more `commcal sweep` arguments, e.g. --concurrent")
    p.add_argument("--after-gemm", type=int, default=384, metavar="N",
                   help="also sweep with an N x N GEMM before each call, for the after-compute models (0: no)")
    p.add_argument("--mesh", default="2x2", help="validate's mesh (default 2x2; 2 for a control with one rank per "
                                                  "core: one node with --links intra, or two nodes with --links inter)")
    p.add_argument("--layer", action="append", metavar="SPEC",
                   help="validate these layers instead of the default three (repeatable), e.g. shapes of your own")
    args, out, commcal, launch = parse_common(p, argv)
    cal = args.calibration
    if cal is None:
        cal = calibrate([*launch, *commcal, "sweep", *SWEEP, "--links", args.links, *shlex.split(args.sweep_args)],
                        args.after_gemm, out)
    layers = [a for spec in (args.layer or LAYERS) for a in ("--layer", spec)]
    runs = [out / ("validate" if i == 0 else f"validate-{i + 1}") for i in range(args.repeat)]
    for run in runs:
        _run([*launch, *commcal, "validate", cal, "--mesh", args.mesh, "--out", str(run), *layers,
              *shlex.split(args.validate_args)])
    summaries, columns, _ = score_runs(runs)
    _print(columns)
    for i, s in enumerate(summaries):
        print(f"run {i + 1}, where the error comes from:\n" + attribution.describe(s["by_link"], s["step_ratios"]))
        print(f"  CPU time taken by the hypervisor (steal): {provenance.steal_text(s['cpu_steal'])}")
        if s.get("slow_launch"):
            print(f"  a slow launch: every collective ran more than {attribution.OFF_PRICE:.0%} slower than its price "
                  "(summary.json slow_launch)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
