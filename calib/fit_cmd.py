"""`commcal fit RUN_DIR... --out calibration.json`: fit every run's samples, validate the calibration against
its JSON Schema, write it atomically, and print the held-out error figures and every warning."""

from __future__ import annotations

import argparse
import sys

from calib.calibration import calibration_from_dict
from calib.points import check_pages, load_runs
from microbench.atomic import not_an_input
from microbench.errors import UsageError
from microbench.flags import add_backend_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories written by `commcal sweep` or "
                                                              "`commcal import`")
    p.add_argument("--out", required=True, help="calibration JSON to write")
    p.add_argument("--method", choices=("huber", "wls"), default="huber",
                   help="huber: robust regression for relative error, a point at another speed than its neighbours "
                        "moves the line little (default); wls: weighted least squares, every point weighs alike")
    p.add_argument("--folds", type=int, default=5, help="k of the k-fold held-out check over sizes (default 5)")
    p.add_argument("--max-segments", type=int, default=5,
                   help="most size segments (protocol or algorithm switches) per model (default 5)")
    p.add_argument("--after-compute", action="append", default=[], metavar="RUN_DIR",
                   help="a run of `commcal sweep --after-gemm N` (repeatable): its collectives become the models that "
                        "price a collective right after a local computation, as in a training step")
    add_backend_argument(p, "backend to fit when runs mix several", default=None)
    p.add_argument("--mix-methods", action="store_true",
                   help="fit runs of different timing methods together (sweeps and imported peer logs, or two peers)")
    p.add_argument("--quiet", action="store_true", help="print warnings only")


def run(args: argparse.Namespace) -> int:
    if args.folds < 2 or args.max_segments < 1:
        raise UsageError("--folds must be >= 2 and --max-segments >= 1")
    not_an_input(args.out, [*args.runs, *(args.after_compute or [])])
    runs = load_runs(args.runs, args.backend, args.mix_methods)
    after = load_runs(args.after_compute, args.backend, args.mix_methods) if args.after_compute else None
    if after is not None:
        check_pages(runs.runs + after.runs)
    from calib.fit import FitOptions, fit_result    # statsmodels takes seconds to import: not before the runs are read

    cal = fit_result(runs, FitOptions(method=args.method, folds=args.folds, max_segments=args.max_segments), after)
    # a value no schema allows comes from the runs' files (run.json), not from --out: name them, write nothing
    calibration_from_dict(cal.to_json(), f"the calibration fitted from {', '.join(args.runs)} (nothing written)")
    cal.write(args.out)
    if not args.quiet:
        print(cal.summary())
        extra = len(cal.after_compute.models) if after else 0
        print(f"wrote {args.out}: {len(cal.models)} models" + (f" and {extra} after-compute models" if extra else "")
              + f", {len(cal.hockney)} Hockney rows, {len(runs.points)} points from {len(runs.runs)} run(s)")
    for w in cal.warnings:
        print(f"WARNING: {w}", file=sys.stderr)
    return 0
