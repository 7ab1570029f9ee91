"""`commcal export CAL --format calculon|astra-sim|simai --out FILE`: a calibration as a planner's own machine
description; prints each field the format needs that the calibration could not supply."""

from __future__ import annotations

import argparse

from calib import export
from calib.calibration import load_calibration
from microbench.atomic import atomic_write_text, not_an_input
from microbench.errors import UsageError

FORMATS = ("calculon", "astra-sim", "simai")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("calibration", metavar="CAL", help="a calibration JSON from `commcal fit`")
    p.add_argument("--format", required=True, choices=FORMATS,
                   help="calculon: system JSON (network tiers, matrix rate); astra-sim: analytical network YAML; "
                        "simai: busbw.yaml")
    p.add_argument("--out", required=True, metavar="FILE", help="file to write")
    p.add_argument("--topology", metavar="T,...",
                   help=f"astra-sim: each dimension's topology ({', '.join(export.ASTRA_TOPOLOGIES)}), innermost "
                        "first; not measured, so not guessed")


def run(args: argparse.Namespace) -> int:
    if args.topology is not None and args.format != "astra-sim":
        raise UsageError(f"--topology is astra-sim's; the {args.format} format has no topology to set")
    not_an_input(args.out, [args.calibration])
    cal = load_calibration(args.calibration)
    if args.format == "calculon":
        out = export.calculon(cal)
    elif args.format == "astra-sim":
        out = export.astra_sim(cal, args.topology.split(",") if args.topology else None)
    else:
        out = export.simai(cal)
    atomic_write_text(args.out, out.text)
    print(f"wrote {args.out} ({args.format})")
    for field in out.missing:
        print(f"not exported, the calibration lacks it: {field}")
    return 0
