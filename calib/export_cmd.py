"""`commcal export CAL --format calculon|astra-sim|simai --out FILE`: a calibration as a planner's own machine
description; prints each field the format needs that the calibration could not supply, and each one written from
another source than its level's own measurement."""

from __future__ import annotations

import argparse

from calib import export
from calib.calibration import load_calibration
from microbench.atomic import atomic_write_text, not_an_input
from microbench.errors import UsageError
from microbench.jsonfile import read_json

FORMATS = ("calculon", "astra-sim", "simai")
MAX_DEVICES = 1 << 24
SYSTEM_KEYS = ("matrix", "vector", "mem1", "mem2", "networks", "processing_mode")
"""The keys of a Calculon system file: a --template holds at least one."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("calibration", metavar="CAL", help="a calibration JSON from `commcal fit`")
    p.add_argument("--format", required=True, choices=FORMATS,
                   help="calculon: system JSON (network tiers, matrix rates); astra-sim: analytical network YAML; "
                        "simai: busbw.yaml")
    p.add_argument("--out", required=True, metavar="FILE", help="file to write")
    p.add_argument("--topology", metavar="T,...",
                   help=f"astra-sim: each dimension's topology ({', '.join(export.ASTRA_TOPOLOGIES)}), innermost "
                        "first; not measured, so not guessed")
    p.add_argument("--tier-sizes", metavar="N,...",
                   help="calculon, astra-sim: the devices each level spans, innermost first (e.g. 8,4480: 8 per "
                        "node, 4480 in all). Default: the calibration's machine (intra: ranks per node; the outer "
                        "level: nodes x ranks per node)")
    p.add_argument("--template", metavar="SYSTEM.json",
                   help="calculon: a Calculon system file (e.g. one of its own) whose unmeasured fields (vector, "
                        "mem1, mem2, processing_mode, each tier's must_be_filled and processor_usage) complete "
                        "the export, so that Calculon loads it")


def tier_sizes(text: str) -> list[int]:
    """--tier-sizes: positive whole device counts."""
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise UsageError(f"--tier-sizes {text!r}: give whole device counts, innermost first, e.g. 8,4480") from None
    if any(not 1 <= n <= MAX_DEVICES for n in sizes):
        raise UsageError(f"--tier-sizes {text!r}: each count must be 1 to {MAX_DEVICES}")
    return sizes


def read_template(path: str) -> dict:
    """--template: a JSON object with at least one of a Calculon system's keys, and not one of commcal's own files
    (whose keys the export would copy into the system as if Calculon's)."""
    template = read_json(path, "Calculon system file")
    schema = template.get("schema") if isinstance(template, dict) else None
    if isinstance(schema, str) and schema.startswith("commcal."):
        raise UsageError(f"{path}: a {schema.replace('.', ' ', 1)} file (schema {schema!r}), not a Calculon system "
                         f"file")
    if not isinstance(template, dict) or not set(template) & set(SYSTEM_KEYS):
        raise UsageError(f"{path}: not a Calculon system file (a JSON object holding some of {', '.join(SYSTEM_KEYS)})")
    problem = export.template_problem(template)
    if problem:
        raise UsageError(f"{path}: {problem} (Calculon's reader would refuse the system written from it)")
    return template


def run(args: argparse.Namespace) -> int:
    if args.topology is not None and args.format != "astra-sim":
        raise UsageError(f"--topology is astra-sim's; the {args.format} format has no topology to set")
    if args.tier_sizes is not None and args.format == "simai":
        raise UsageError("--tier-sizes is for calculon and astra-sim; SimAI takes its group sizes as its own arguments")
    if args.template is not None and args.format != "calculon":
        raise UsageError(f"--template is calculon's; the {args.format} format has no template to complete")
    not_an_input(args.out, [args.calibration, *([args.template] if args.template else [])])
    sizes = tier_sizes(args.tier_sizes) if args.tier_sizes is not None else None
    template = read_template(args.template) if args.template is not None else None
    cal = load_calibration(args.calibration)
    if args.format == "calculon":
        out = export.calculon(cal, sizes, template)
    elif args.format == "astra-sim":
        out = export.astra_sim(cal, args.topology.split(",") if args.topology else None, sizes)
    else:
        out = export.simai(cal)
    atomic_write_text(args.out, out.text)
    print(f"wrote {args.out} ({args.format})")
    for field in out.missing:
        print(f"not exported, the calibration lacks it: {field}")
    for note in out.notes:
        print(f"written from elsewhere: {note}")
    return 0
