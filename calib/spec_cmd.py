"""`commcal calibration from-spec SPEC --out CAL`: a calibration of a machine not measured, from a hardware spec
file (calib.spec; a shipped one by name, e.g. `selene`), validated and written atomically like a fitted one."""

from __future__ import annotations

import argparse

from calib.calibration import validate
from calib.spec import load_spec


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("from-spec",), help="from-spec: write a calibration from a hardware spec")
    p.add_argument("spec", help="spec JSON (docs/training.md#spec), or a shipped spec's name: selene")
    p.add_argument("--out", required=True, help="calibration JSON to write")


def run(args: argparse.Namespace) -> int:
    result = load_spec(args.spec)
    data = result.to_json()
    validate(data, args.spec)
    result.write(args.out)
    tiers = ", ".join(f"{link} {1 / m.beta_s_per_byte / 1e9:.4g} GB/s" for (op, link), m in result.models.items()
                      if op == "pingpong")
    print(f"wrote {args.out}: {result.provenance['runs'][0]['machine']} from the spec {args.spec} ({tiers}; "
          f"GEMM {', '.join(result.gemm)}; {result.memory_bytes / 2**30:g} GiB per device)")
    return 0
