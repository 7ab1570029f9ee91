"""Benchmark: ParaDL's table on the machine it runs on. Sweeps the collectives, sendrecv (the halo exchange) and the GEMM and
copy rates (--quick, every group and rank at once: --concurrent, ParaDL's contention), sweeps them again right after
a GEMM (--after-gemm, as benchmarks.validate does, for the collectives that follow a computation), fits a
calibration, profiles the networks' local kernels (`commcal profile`: compute measured per kernel, as ParaDL's oracle
profiles its layers), validates the CNN presets whole under each of ParaDL's strategies (data, filter, channel,
spatial on mesh 4; data+filter and data+spatial on mesh 2x2) with that profile, and prints per strategy the predicted
and measured step, accuracy 1 - |p - m| / m, the accuracy of the calibration's GEMM and copy rates alone on the same
measurements, and ParaDL's published accuracy (Kahira et al., HPDC 2021). The pipeline (4 stages
balanced by time, GPipe, 4 micro-batches: `search`'s) runs on mesh 4 too, on the pipeline executor. On one host with
4 ranks:

    python -m benchmarks.paradl --launch "mpirun -n 4 --oversubscribe --bind-to none" --out /tmp/paradl

and on 2 nodes of 2 ranks (mesh 4 then spans the nodes, mesh 2x2 puts its first axis between them):

    python -m benchmarks.paradl --launch "slurm/cluster.sh mpirun -n 4 --host node1:2,node2:2" --out /tmp/paradl

--calibration CAL skips the sweep and the fit, --profile FILE the profiling, --no-profile prices compute by the rates
alone; --model SPEC (repeatable) picks the networks (default vgg-small and resnet-small); --repeat 2 validates
everything twice in turn and prints the accuracy one run's measurements reach as the prediction of the other's;
--mesh M (repeatable) picks the meshes, e.g. --mesh 2 alone on 2 ranks."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pandas as pd

from analysis.mesh import parse_mesh
from analysis.models import parse_model
from analysis.paradl import PUBLISHED, network_table
from analysis.pricing import Pricer
from analysis.search import Tabulator
from benchmarks.validate import _run, calibrate, guarded
from calib.calibration import load_calibration
from microbench.topology import nodes_of
from benchmarks import benchmark_parser

SWEEP = ["--quick", "--concurrent", "--ops", "allreduce,allgather,reduce_scatter,alltoall,sendrecv,pingpong,gemm,copy",
         "--gemm-sizes", "16K,64K,256K,1M"]
MESHES = ("4", "2x2")
STRATEGIES = {1: "data,filter,channel,spatial,pipeline", 2: "data+filter,data+spatial"}
"""The strategies validated on a 1-d and a 2-d mesh: each of ParaDL's once (the pure ones on the 1-d mesh)."""


def main(argv=None) -> int:
    return guarded(_bench, argv, "bench_paradl")


def _bench(argv) -> int:
    p = benchmark_parser("benchmarks.paradl", __doc__)
    p.add_argument("--launch", required=True, help="MPI launcher prefix for the meshes' ranks (4 by default)")
    p.add_argument("--mesh", action="append", default=[],
                   help="a mesh to validate on (repeatable; default 4 and 2x2): a 1-d one runs data, filter, channel, "
                        "spatial and the pipeline, a 2-d one data+filter and data+spatial")
    p.add_argument("--out", required=True)
    p.add_argument("--calibration", help="use this calibration (skip sweep and fit)")
    p.add_argument("--model", action="append", default=[], metavar="SPEC",
                   help="a CNN preset or spec (repeatable; default vgg-small and resnet-small)")
    p.add_argument("--sweep-args", default="", help="more `commcal sweep` arguments, e.g. --concurrent")
    p.add_argument("--after-gemm", type=int, default=384, metavar="N",
                   help="the N x N GEMM before each call of the second sweep (default 384, benchmarks.validate's)")
    p.add_argument("--profile", help="use this compute profile (skip `commcal profile`)")
    p.add_argument("--no-profile", action="store_true",
                   help="price compute by the calibration's GEMM and copy rates alone (no `commcal profile`)")
    p.add_argument("--validate-args", default="", help="more `commcal validate` arguments")
    p.add_argument("--repeat", type=int, default=1,
                   help="validate every network and mesh this many times, in turn (default 1); with 2 or more, also "
                        "print each run's measured times scored as the prediction of the next run's: the accuracy a "
                        "repeat measurement reaches on the machine measured")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    out = Path(args.out)
    commcal = [sys.executable, "-m", "reports.cli"]
    launch = shlex.split(args.launch)
    models = args.model or ["vgg-small", "resnet-small"]
    meshes = [(mesh, STRATEGIES.get(len(mesh.split("x")))) for mesh in args.mesh or MESHES]
    if any(strategies is None for _, strategies in meshes):
        p.error("--mesh takes a 1-d or 2-d mesh, e.g. 4 or 2x2")
    cal = args.calibration
    if cal is None:
        cal = calibrate([*launch, *commcal, "sweep", *SWEEP, *shlex.split(args.sweep_args)], args.after_gemm, out)
    profile = None if args.no_profile else args.profile
    if profile is None and not args.no_profile:
        profile = str(out / "profile.json")
        _run([*launch, *commcal, "profile", *[a for m in models for a in ("--model", m)],
              *[a for mesh, _ in meshes for a in ("--mesh", mesh)], "--out", profile])
    rates_cal = load_calibration(cal) if profile else None
    rows = []
    for rep in range(args.repeat):
        for model in models:
            for mesh, strategies in meshes:
                run = out / (f"{model.replace(':', '_')}-{mesh}" + (f"-{rep + 1}" if rep else ""))
                _run([*launch, *commcal, "validate", cal, "--model", model, "--mesh", mesh, "--strategies",
                      strategies, "--out", str(run), *(["--profile", profile] if profile else []),
                      *shlex.split(args.validate_args)])
                frame = pd.read_parquet(run / "strategies.parquet")
                rates = _without_profile(rates_cal, model, mesh, run) if profile else {}
                rows += [{"run": rep + 1, "model": model, "mesh": mesh, "strategy": r.strategy,
                          "predicted_s": r.predicted_s, "measured_s": r.measured_s,
                          "rates_s": rates.get(r.strategy, float("nan"))} for r in frame.itertuples()]
    table = pd.DataFrame(rows)
    table["accuracy"] = 1 - (table["predicted_s"] - table["measured_s"]).abs() / table["measured_s"]
    table["rates_accuracy"] = 1 - (table["rates_s"] - table["measured_s"]).abs() / table["measured_s"]
    nxt = table.groupby(["model", "mesh", "strategy"])["measured_s"].shift(-1)      # the next run's measurement
    table["repeat_accuracy"] = 1 - (table["measured_s"] - nxt).abs() / nxt
    table.to_csv(out / "paradl.csv", index=False)
    _print(table, profile)
    return 0


def _without_profile(calibration, spec: str, mesh_text: str, run: Path) -> dict[str, float]:
    """Each strategy's step as the calibration alone prices it (compute at its GEMM and copy rates) on the validate
    run's mesh: the same measurements scored without the profile."""
    hosts = json.loads((run / "run.json").read_text())["hosts"]
    mesh = parse_mesh(mesh_text, len(nodes_of(hosts)[0]))
    rows = network_table(spec, parse_model(spec), Tabulator(Pricer(calibration, mesh)), calibration)
    return {r["strategy"]: r["total_s"] for r in rows if r["total_s"] is not None}


def _print(table: pd.DataFrame, profile: str | None) -> None:
    """One row per (run, strategy, model), then per strategy the mean accuracy over the models and runs beside
    ParaDL's; with a profile, the accuracy of the calibration's rates alone on the same measurements; over several
    runs, the accuracy of each run's measurements as the prediction of the next's."""
    rates, repeat = profile is not None, table["run"].nunique() > 1
    print(f"compute priced by {'the profile ' + profile if rates else 'the calibration GEMM and copy rates'}")
    extra = [("rates only", "rates_accuracy")] * rates + [("repeat", "repeat_accuracy")] * repeat

    def pct(v, width: int) -> str:
        return f"{100 * v:{width - 1}.2f}%" if v == v else f"{'-':>{width}}"

    print(f"{'run':>3} {'strategy':<14} {'model':<14} {'mesh':>4} {'predicted':>11} {'measured':>11} {'accuracy':>9}"
          + "".join(f" {name:>11}" for name, _ in extra))
    for r in table.itertuples():
        meas = f"{r.measured_s * 1e3:8.3f} ms" if r.measured_s == r.measured_s else "          -"
        print(f"{r.run:>3} {r.strategy:<14} {r.model:<14} {r.mesh:>4} {r.predicted_s * 1e3:8.3f} ms {meas} "
              f"{pct(r.accuracy, 9)}" + "".join(f" {pct(getattr(r, col), 11)}" for _, col in extra))
    print(f"\n{'strategy':<14} {'accuracy':>9} {'ParaDL':>8}       " + "".join(f" {name:>11}" for name, _ in extra))
    means: dict[str, list[float]] = {"accuracy": [], **{col: [] for _, col in extra}}
    for name in dict.fromkeys([*PUBLISHED, *table["strategy"]]):
        rows = table.loc[table["strategy"] == name]
        published = PUBLISHED.get(name)
        theirs = f"{100 * published:7.2f}%" if published else "      -"
        if rows["accuracy"].dropna().empty:
            print(f"{name:<14} {'not run':>9} {theirs}")
            continue
        got = {col: rows[col].dropna().mean() for col in means}
        for col, v in got.items():
            means[col].append(v)
        verdict = "     " if published is None else "above" if got["accuracy"] > published else "below"
        print(f"{name:<14} {pct(got['accuracy'], 9)} {theirs}  {verdict}"
              + "".join(f" {pct(got[col], 11)}" for _, col in extra))
    mean_published = sum(PUBLISHED.values()) / len(PUBLISHED)
    n = len(means["accuracy"])
    print(f"{'mean':<14} {pct(sum(means['accuracy']) / n, 9)} {100 * mean_published:7.2f}%       "
          + "".join(f" {pct(sum(means[col]) / n, 11)}" for _, col in extra)
          + f"  (ours over the {n} strategies measured)")


if __name__ == "__main__":
    sys.exit(main())
