"""Benchmark: ParaDL's table on this machine. Sweeps the collectives, sendrecv (the halo exchange) and the GEMM and
copy rates (--quick, every group and rank at once: --concurrent, ParaDL's contention), sweeps them again right after
a GEMM (--after-gemm, as benchmarks.validate does, for the collectives that follow a computation), fits a
calibration, validates the CNN presets whole under each of ParaDL's strategies (data, filter, channel, spatial on
mesh 4; data+filter and data+spatial on mesh 2x2), and prints per strategy the predicted and measured step, accuracy
1 - |p - m| / m, and ParaDL's published accuracy beside it (Kahira et al., HPDC 2021). The pipeline (4 stages
balanced by time, GPipe, 4 micro-batches: `search`'s) runs on mesh 4 too, on the pipeline executor. On one host with
4 ranks:

    python -m benchmarks.paradl --launch "mpirun -n 4 --oversubscribe --bind-to none" --out /tmp/paradl

--calibration CAL skips the sweep and the fit; --model SPEC (repeatable) picks the networks (default vgg-small and
resnet-small)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import pandas as pd

from analysis.paradl import PUBLISHED
from benchmarks.validate import _run, calibrate, guarded

SWEEP = ["--quick", "--concurrent", "--ops", "allreduce,allgather,reduce_scatter,alltoall,sendrecv,pingpong,gemm,copy",
         "--gemm-sizes", "16K,64K,256K,1M"]
MESHES = (("4", "data,filter,channel,spatial,pipeline"), ("2x2", "data+filter,data+spatial"))


def main(argv=None) -> int:
    return guarded(_bench, argv, "bench_paradl")


def _bench(argv) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--launch", required=True, help="MPI launcher prefix for 4 ranks")
    p.add_argument("--out", required=True)
    p.add_argument("--calibration", help="use this calibration (skip sweep and fit)")
    p.add_argument("--model", action="append", default=[], metavar="SPEC",
                   help="a CNN preset or spec (repeatable; default vgg-small and resnet-small)")
    p.add_argument("--sweep-args", default="", help="more `commcal sweep` arguments, e.g. --concurrent")
    p.add_argument("--after-gemm", type=int, default=384, metavar="N",
                   help="the N x N GEMM before each call of the second sweep (default 384, benchmarks.validate's)")
    p.add_argument("--validate-args", default="", help="more `commcal validate` arguments")
    args = p.parse_args(argv)
    out = Path(args.out)
    commcal = [sys.executable, "-m", "reports.cli"]
    launch = shlex.split(args.launch)
    cal = args.calibration
    if cal is None:
        cal = calibrate([*launch, *commcal, "sweep", *SWEEP, *shlex.split(args.sweep_args)], args.after_gemm, out)
    rows = []
    for model in args.model or ["vgg-small", "resnet-small"]:
        for mesh, strategies in MESHES:
            run = out / f"{model.replace(':', '_')}-{mesh}"
            _run([*launch, *commcal, "validate", cal, "--model", model, "--mesh", mesh, "--strategies", strategies,
                  "--out", str(run), *shlex.split(args.validate_args)])
            frame = pd.read_parquet(run / "strategies.parquet")
            rows += [{"model": model, "mesh": mesh, "strategy": r.strategy, "predicted_s": r.predicted_s,
                      "measured_s": r.measured_s} for r in frame.itertuples()]
    table = pd.DataFrame(rows)
    table["accuracy"] = 1 - (table["predicted_s"] - table["measured_s"]).abs() / table["measured_s"]
    table.to_csv(out / "paradl.csv", index=False)
    _print(table)
    return 0


def _print(table: pd.DataFrame) -> None:
    """One row per (strategy, model), then per strategy the mean accuracy over the models beside ParaDL's."""
    print(f"{'strategy':<14} {'model':<14} {'mesh':>4} {'predicted':>11} {'measured':>11} {'accuracy':>9}")
    for r in table.itertuples():
        meas = f"{r.measured_s * 1e3:8.3f} ms" if r.measured_s == r.measured_s else "          -"
        acc = f"{100 * r.accuracy:8.2f}%" if r.accuracy == r.accuracy else "        -"
        print(f"{r.strategy:<14} {r.model:<14} {r.mesh:>4} {r.predicted_s * 1e3:8.3f} ms {meas} {acc}")
    print(f"\n{'strategy':<14} {'accuracy':>9} {'ParaDL':>8}")
    ours = []
    for name in dict.fromkeys([*PUBLISHED, *table["strategy"]]):
        acc = table.loc[table["strategy"] == name, "accuracy"].dropna()
        published = PUBLISHED.get(name)
        theirs = f"{100 * published:7.2f}%" if published else "      -"
        if acc.empty:
            print(f"{name:<14} {'not run':>9} {theirs}")
            continue
        ours.append(acc.mean())
        verdict = "" if published is None else "above" if acc.mean() > published else "below"
        print(f"{name:<14} {100 * acc.mean():8.2f}% {theirs}  {verdict}")
    mean_published = sum(PUBLISHED.values()) / len(PUBLISHED)
    print(f"{'mean':<14} {100 * sum(ours) / len(ours):8.2f}% {100 * mean_published:7.2f}%  (ours over the "
          f"{len(ours)} strategies measured)")


if __name__ == "__main__":
    sys.exit(main())
