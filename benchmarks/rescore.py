"""Re-price stored validate runs with another calibration, no MPI: each collective step of steps.csv priced again,
the strategies scored as validate scores them, beside the figures the run stored. For judging a change of the fit
on validates already measured (refit the sweep the validate's calibration came from, then rescore).

    commcal fit RUN --after-compute RUN-after-gemm384 --out NEW.json
    python -m benchmarks.rescore NEW.json VALIDATE_DIR [VALIDATE_DIR...]
    python -m benchmarks.rescore NEW.json VALIDATE_DIR --anchor RUN --anchor-after RUN-after-gemm384

--anchor (an experiment, not the product's pricing): each price times the ratio of the sweep's measured point to the
model there, interpolated in log size between the measured sizes (the model alone outside them).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import ranking
from analysis.mesh import Mesh, parse_mesh
from analysis.pricing import Pricer
from calib.calibration import load_calibration
from calib.points import load_runs
from microbench.errors import UsageError
from microbench.ops import OPS
from benchmarks import benchmark_parser

METRICS = ("comm_mean_accuracy", "comm_kendall_tau", "comm_regret")


def _mesh(summary: dict) -> Mesh:
    """The validate's mesh from its summary's text (analysis.mesh.Mesh's str, e.g. '2x2 (2 nodes x 2 ranks)'); the
    summary keeps no switch levels, so a run on a topology of several is priced as flat."""
    found = re.fullmatch(r"\s*(\S+)\s*\(\s*\d+ nodes? x (\d+) ranks?\)\s*", str(summary.get("mesh", "")))
    if not found:
        raise UsageError(f"cannot read the mesh {summary.get('mesh')!r} of its summary.json")
    return parse_mesh(found.group(1), int(found.group(2)))


class Anchor:
    """Per (op, link, procs, after): log2 sizes and log(measured / model) of the sweeps' points."""

    def __init__(self, cal, runs: dict[bool, str]):
        self.cal, self.points, self.cache = cal, {a: load_runs([r]).points for a, r in runs.items()}, {}

    def ratio(self, op: str, link: str, procs: int, after: bool, size: float) -> float:
        key = (op, link, procs, after)
        if key not in self.cache:
            p = self.points.get(after, self.points.get(False))
            q = p[(p.op == op) & (p.link == link) & (p.procs == procs)].groupby("size_bytes")["seconds"].median()
            model = self.cal.predict_seconds(op, link, procs, q.index.to_numpy(float), after)
            self.cache[key] = (np.log2(q.index.to_numpy(float)), np.log(q.to_numpy() / model))
        x, r = self.cache[key]
        if not len(x) or not x[0] <= np.log2(size) <= x[-1]:
            return 1.0
        return float(np.exp(np.interp(np.log2(size), x, r)))


def rescore(run: Path, pricer: Pricer, anchor: Anchor | None) -> dict:
    """The run's metrics with its collective steps priced by `pricer` (times anchor's ratio), their layout copies
    included; a steps.csv from before validate recorded the copies has them priced as none (a note says so)."""
    steps = pd.read_csv(run / "steps.csv")
    coll = steps[steps["op"].isin(list(OPS)) & (steps["size_bytes"] > 0)].copy()
    if not {"copy_calls", "copy_elements"} <= set(coll.columns):
        print(f"rescore: {run}/steps.csv records no layout copies (an older validate): its steps are re-priced "
              "without them", file=sys.stderr)
        coll["copy_calls"] = coll["copy_elements"] = 0
    new = []
    for op, axis, size, after, calls, elements in zip(coll["op"], coll["axis"], coll["size_bytes"],
                                                      coll["after_compute"], coll["copy_calls"], coll["copy_elements"]):
        price = float(pricer.seconds(op, int(axis), float(size), after=bool(after)))
        if anchor is not None:
            price *= anchor.ratio(op, pricer.link(op, int(axis)), pricer.mesh.shape[int(axis)], bool(after),
                                  float(pricer.priced_bytes(op, int(axis), float(size))))
        new.append(price + pricer.copy_calls_seconds(int(calls), float(elements)))
    coll["delta"] = np.array(new) - coll["predicted_s"]
    delta = coll.groupby(["layer", "strategy"])["delta"].sum()
    frame = pd.read_parquet(run / "strategies.parquet")
    frame["predicted_comm_s"] += [delta.get(k, 0.0) for k in zip(frame["layer"], frame["strategy"])]
    return ranking.flat(ranking.frame_scores(frame, 3, 0, 0))


def main(argv: list[str] | None = None) -> int:
    ap = benchmark_parser("benchmarks.rescore", __doc__)
    ap.add_argument("calibration", help="the calibration to price with")
    ap.add_argument("runs", nargs="+", type=Path, help="validate output directories (steps.csv, strategies.parquet)")
    ap.add_argument("--anchor", help="the sweep run the calibration was fitted from (anchor its points)")
    ap.add_argument("--anchor-after", help="its after-compute sweep run")
    args = ap.parse_args(argv)
    try:
        _print_rescored(args)
    except UsageError as exc:
        print(f"rescore: {exc}", file=sys.stderr)
        return 2
    return 0


def _print_rescored(args: argparse.Namespace) -> None:
    """Each run's stored metrics beside the re-priced ones; UsageError for a calibration, run or summary it cannot
    read."""
    cal = load_calibration(args.calibration)
    anchor = None
    if args.anchor:
        anchor = Anchor(cal, {False: args.anchor, **({True: args.anchor_after} if args.anchor_after else {})})
    print(f"{'run':<60} " + " ".join(f"{m:>28}" for m in METRICS))
    for run in args.runs:
        missing = [f for f in ("summary.json", "steps.csv", "strategies.parquet") if not (run / f).is_file()]
        if missing:
            raise UsageError(f"{run} is not a validate directory (no {missing[0]})")
        try:
            summary = json.loads((run / "summary.json").read_text())
            mesh = _mesh(summary)
        except (ValueError, UsageError) as exc:
            raise UsageError(f"{run}: {exc}") from None
        new = rescore(run, Pricer(cal, mesh), anchor)
        cells = [f"{summary['metrics'][m]['value']:.4f} -> {new[m]['value']:.4f}" for m in METRICS]
        print(f"{str(run)[-60:]:<60} " + " ".join(f"{c:>28}" for c in cells))

if __name__ == "__main__":
    sys.exit(main())
