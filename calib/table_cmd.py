"""`commcal table CAL [--format md|csv]`: print a calibration's alpha/beta tables."""

from __future__ import annotations

import argparse
import sys

from calib import tables
from calib.calibration import load_calibration


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("calibration", help="calibration JSON written by `commcal fit`")
    p.add_argument("--format", choices=("md", "csv"), default="md", help="Markdown (default) or CSV")


def run(args: argparse.Namespace) -> int:
    cal = load_calibration(args.calibration)
    sys.stdout.write(tables.markdown(cal) if args.format == "md" else tables.csv(cal))
    return 0
