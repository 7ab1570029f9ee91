"""`commcal predict CAL --op OP --link LINK --procs P --bytes SIZE [--after-compute] [--json]`: one predicted time
with its 95% interval, saying when it extrapolates beyond what was measured. With --layer/--strategy/--mesh instead
of --op, the plan and cost of one layer strategy (analysis.predict_strategy)."""

from __future__ import annotations

import argparse
import json

from calib.calibration import load_calibration
from microbench.errors import UsageError
from microbench.records import LINK_CLASSES
from microbench.sizes import format_size, parse_size


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("calibration", help="calibration JSON written by `commcal fit`")
    p.add_argument("--op", help="operation, e.g. allreduce, allgather, pingpong")
    p.add_argument("--link", choices=LINK_CLASSES, help="link class")
    p.add_argument("--procs", type=int, help="process count")
    p.add_argument("--bytes", help="size in the nccl-tests convention, e.g. 64M")
    p.add_argument("--after-compute", action="store_true",
                   help="the call directly follows a local computation: price it by the calibration's after-compute "
                        "model where it has one (commcal fit --after-compute)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    from analysis.predict_strategy import add_arguments as add_strategy_arguments
    from analysis.search_cmd import add_strict_argument

    add_strategy_arguments(p)
    add_strict_argument(p)


def _time(s: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.4g} {unit}"
    return f"{s * 1e9:.4g} ns"


def run(args: argparse.Namespace) -> int:
    cal = load_calibration(args.calibration)
    if args.layer:
        from analysis.predict_strategy import run_strategy

        return run_strategy(args, cal)
    missing = [f"--{name}" for name in ("op", "link", "procs", "bytes") if getattr(args, name) is None]
    if missing:
        raise UsageError(f"predict needs {', '.join(missing)} (or --layer, --strategy and --mesh)")
    nbytes = parse_size(args.bytes)
    if args.after_compute and not cal.after_gemm:
        raise UsageError(f"{args.calibration} has no after-compute models (fit with --after-compute RUN_DIR)")
    from analysis.pricing import Fallback, resolve
    from analysis.search_cmd import report_fallbacks

    link = resolve(cal, args.op, args.link) or args.link        # absent everywhere: predict names what it has
    pred = cal.predict(args.op, link, args.procs, nbytes, args.after_compute)
    fallbacks = [Fallback(args.op, None, args.link, link)] if link != args.link else []
    fallbacks = report_fallbacks(fallbacks, args.calibration, args.strict)
    if args.json:
        print(json.dumps({"op": args.op, "procs": args.procs, "bytes": nbytes, **pred.to_dict(),
                          "fallbacks": fallbacks}))
        return 0
    via = f" (by its {link} model)" if link != args.link else ""
    print(f"{args.op} on {args.link}{via}, p={args.procs}, {format_size(nbytes)}B: {_time(pred.seconds)} "
          f"(95% interval {_time(pred.low_s)} .. {_time(pred.high_s)}; {pred.model} model)")
    if pred.note:
        print(f"note: {pred.note}")
    return 0
