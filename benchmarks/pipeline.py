"""Benchmark: does a machine's calibration rank training configurations (pipeline x tensor x data mixes of 4 ranks,
GPipe/1F1B/interleaved, ZeRO 1) the way real training steps do? Sweeps the collectives, point-to-point, GEMM and copy
at 2 and 4 ranks, fits a calibration, runs `commcal validate --training` --repeat times and prints each run's ranking
metrics beside each run's measured times scored as the prediction of another's (the figures no model can beat while
measurements repeat only that well), then the configurations of the first run. One machine, 4 ranks:

    python -m benchmarks.pipeline --launch "mpirun -n 4 --oversubscribe --bind-to none" --links intra --out /tmp/bp

On the local cluster (2 nodes x 2 ranks):

    slurm/cluster.sh up --nodes 2 --rate 400mbit --no-slurm
    python -m benchmarks.pipeline --launch "slurm/cluster.sh mpirun -n 4 --host node1:2,node2:2" --out /tmp/bp
    slurm/cluster.sh down

--calibration CAL skips the sweep and the fit."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd

from benchmarks.validate import _print, _run, score_runs

MODEL = "transformer:d=64,heads=4,layers=8,seq=32,batch=16"
SWEEP = ["--ops", "allreduce,allgather,reduce_scatter,pingpong,gemm,copy", "--procs", "2,4", "--sizes", "1K:4M",
         "--gemm-sizes", "16K,64K,256K,1M", "--target-ci", "0.05", "--point-budget", "0.3", "--retries", "2"]


def table(frame: pd.DataFrame) -> str:
    """The configurations' predicted and measured seconds, fastest measured first."""
    cols = ["strategy", "micro_batches", "predicted_s", "measured_s", "predicted_comm_s", "measured_comm_s"]
    return frame.sort_values("measured_s")[cols].to_string(index=False, float_format=lambda v: f"{v * 1e3:.2f}ms")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--launch", required=True, help="MPI launcher prefix for 4 ranks")
    p.add_argument("--out", required=True)
    p.add_argument("--calibration", help="use this calibration (skip sweep and fit)")
    p.add_argument("--links", default="intra,inter,spread", help="link classes to sweep (intra alone on one host)")
    p.add_argument("--model", default=MODEL, help=f"the transformer (default {MODEL})")
    p.add_argument("--validate-args", default="", help="more `commcal validate` arguments")
    p.add_argument("--repeat", type=int, default=2, help="validate this many times (default 2)")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    out = Path(args.out)
    commcal = [sys.executable, "-m", "reports.cli"]
    launch = shlex.split(args.launch)
    try:
        cal = args.calibration
        if cal is None:
            cal = str(out / "calibration.json")
            _run([*launch, *commcal, "sweep", *SWEEP, "--links", args.links, "--out", str(out / "sweep")])
            _run([*commcal, "fit", str(out / "sweep"), "--out", cal])
        runs = [out / ("validate" if i == 0 else f"validate-{i + 1}") for i in range(args.repeat)]
        for run in runs:
            _run([*launch, *commcal, "validate", cal, "--training", args.model, "--out", str(run),
                  *shlex.split(args.validate_args)])
    except subprocess.CalledProcessError as e:
        print(f"bench_pipeline: {shlex.join(map(str, e.cmd))} exited {e.returncode}", file=sys.stderr)
        return 2 if e.returncode == 2 else 1
    summaries, columns, tables = score_runs(runs)
    _print(columns)
    for i, s in enumerate(summaries):
        print(f"run {i + 1}: measured / predicted by part: "
              + ", ".join(f"{k} {v['median']:.2f}" for k, v in s["part_ratios"].items()))
    print(table(tables[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
