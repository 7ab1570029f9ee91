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

import shlex
import sys

import pandas as pd

from benchmarks.validate import _print, _run, add_common_arguments, guarded, parse_common, score_runs
from benchmarks import benchmark_parser

MODEL = "transformer:d=64,heads=4,layers=8,seq=32,batch=16"
SWEEP = ["--ops", "allreduce,allgather,reduce_scatter,pingpong,gemm,copy", "--procs", "2,4", "--sizes", "1K:4M",
         "--gemm-sizes", "16K,64K,256K,1M", "--target-ci", "0.05", "--point-budget", "0.3", "--retries", "2"]


def table(frame: pd.DataFrame) -> str:
    """The configurations' predicted and measured seconds, fastest measured first."""
    cols = ["strategy", "micro_batches", "predicted_s", "measured_s", "predicted_comm_s", "measured_comm_s"]
    return frame.sort_values("measured_s")[cols].to_string(index=False, float_format=lambda v: f"{v * 1e3:.2f}ms")


def main(argv=None) -> int:
    return guarded(_bench, argv, "bench_pipeline")


def _bench(argv) -> int:
    p = benchmark_parser("benchmarks.pipeline", __doc__)
    add_common_arguments(p, "4 ranks", "intra,inter,spread", 2)
    p.add_argument("--model", default=MODEL, help=f"the transformer (default {MODEL})")
    args, out, commcal, launch = parse_common(p, argv)
    cal = args.calibration
    if cal is None:
        cal = str(out / "calibration.json")
        _run([*launch, *commcal, "sweep", *SWEEP, "--links", args.links, "--out", str(out / "sweep")])
        _run([*commcal, "fit", str(out / "sweep"), "--out", cal])
    runs = [out / ("validate" if i == 0 else f"validate-{i + 1}") for i in range(args.repeat)]
    for run in runs:
        _run([*launch, *commcal, "validate", cal, "--training", args.model, "--out", str(run),
              *shlex.split(args.validate_args)])
    summaries, columns, tables = score_runs(runs)
    _print(columns)
    for i, s in enumerate(summaries):
        print(f"run {i + 1}: measured / predicted by part: "
              + ", ".join(f"{k} {v['median']:.2f}" for k, v in s["part_ratios"].items()))
    print(table(tables[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
