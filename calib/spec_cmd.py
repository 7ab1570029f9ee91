"""`commcal calibration from-spec SPEC --out CAL [--refine RUN_DIR ...]`: a calibration of a machine not measured,
from a hardware spec file (calib.spec; a shipped one by name, e.g. `selene`), refined where measurements of the
machine exist (calib.refine: runs of `commcal sweep` or `commcal import`, fitted as `commcal fit` fits them),
validated and written atomically like a fitted one."""

from __future__ import annotations

import argparse
import sys

from calib.calibration import validate
from calib.fit import FitOptions
from calib.points import load_runs
from calib.refine import refine
from calib.spec import load_spec
from microbench.atomic import not_an_input
from microbench.errors import UsageError
from microbench.records import load_summary


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("from-spec",), help="from-spec: write a calibration from a hardware spec")
    p.add_argument("spec", help="spec JSON (docs/training.md#spec), or a shipped spec's name: selene")
    p.add_argument("--out", required=True, help="calibration JSON to write")
    p.add_argument("--refine", nargs="+", default=[], metavar="RUN_DIR",
                   help="run directories of `commcal sweep` or `commcal import` measured on the machine: each "
                        "(operation, link class), GEMM dtype and copy they measure is priced by their fit, the rest "
                        "by the spec")
    p.add_argument("--method", choices=("huber", "wls"), default="huber", help="--refine's fit method (as fit's)")
    p.add_argument("--folds", type=int, default=5, help="--refine's held-out folds (as fit's, default 5)")
    p.add_argument("--max-segments", type=int, default=5, help="--refine's most segments per model (default 5)")
    p.add_argument("--mix-methods", action="store_true", help="--refine runs of different timing methods together")


def run(args: argparse.Namespace) -> int:
    not_an_input(args.out, [args.spec, *(args.refine or [])])
    result = load_spec(args.spec)
    if args.refine:
        result = _refined(result, args)
    validate(result.to_json(), args.spec)
    result.write(args.out)
    tiers = ", ".join(f"{link} {1 / m.beta_s_per_byte / 1e9:.4g} GB/s" for (op, link), m in result.models.items()
                      if op == "pingpong")
    print(f"wrote {args.out}: {result.provenance['runs'][0]['machine']} from the spec {args.spec} ({tiers}; "
          f"GEMM {', '.join(result.gemm)}; {result.memory_bytes / 2**30:g} GiB per device)")
    if args.refine:
        print(result.warnings[0])
        for w in result.warnings[1:]:
            print(f"WARNING: {w}", file=sys.stderr)
    return 0


def _refined(spec, args: argparse.Namespace):
    """The spec's calibration refined by the runs of --refine; UsageError where a run measured another backend."""
    if args.folds < 2 or args.max_segments < 1:
        raise UsageError("--folds must be >= 2 and --max-segments >= 1")
    for run_dir in args.refine:
        other = sorted(set(load_summary(run_dir)["backend"]) - {spec.backend})
        if other:
            raise UsageError(f"{run_dir}: measured backend {other[0]}, the spec {args.spec} is {spec.backend}: "
                             f"refine a spec with runs of its backend")
    runs = load_runs(args.refine, spec.backend, args.mix_methods)
    return refine(spec, runs, FitOptions(method=args.method, folds=args.folds, max_segments=args.max_segments))
