"""Benchmark of `commcal fit`: wall seconds and peak memory of the real subcommand on a run directory (or on a
synthetic run of --samples samples written first), then its held-out error figures per (op, link).

    python -m benchmarks.fit --samples 10000000        # scale target: <= 30 s, <= 2 GB
    python -m benchmarks.fit RUN_DIR [RUN_DIR...]      # fidelity figures of real runs
"""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from calib.synthetic import DEFAULT_SIZES, TrueModel, write_synthetic_run
from benchmarks import benchmark_parser

OPS = ("allreduce", "allgather", "reduce_scatter", "alltoall", "bcast", "reduce", "pingpong", "sendrecv")
LINKS = {"intra": [2, 4, 8], "inter": [2, 4, 8]}


def synthetic_run(out: Path, samples: int) -> Path:
    """Every operation on two links at p = 2, 4, 8 over 8 B..64 MiB, with samples spread evenly over points."""
    models = {(op, link): TrueModel.line(2e-6 if link == "intra" else 20e-6, 1e-10 if link == "intra" else 1e-9)
              for op in OPS for link in LINKS}
    points = sum(1 if op in ("pingpong", "sendrecv") else len(LINKS[link]) for op, link in models) * len(DEFAULT_SIZES)
    return write_synthetic_run(out, models, LINKS, samples=max(1, samples // points), noise=0.02,
                               outlier_fraction=0.02, gemm={"float32": 5e10}, write_points=False)


def main(argv: list[str] | None = None) -> int:
    ap = benchmark_parser("benchmarks.fit", __doc__)
    ap.add_argument("runs", nargs="*", help="run directories to fit (default: a synthetic run)")
    ap.add_argument("--samples", type=int, default=10_000_000, help="samples in the synthetic run")
    ap.add_argument("--method", choices=("huber", "wls"), default="huber")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="commcal-bench-") as tmp:
        runs = args.runs
        if not runs:
            t0 = time.perf_counter()
            runs = [str(synthetic_run(Path(tmp) / "run", args.samples))]
            print(f"wrote a synthetic run of ~{args.samples:,} samples in {time.perf_counter() - t0:.1f} s", flush=True)
        out = Path(tmp) / "calibration.json"
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "reports.cli", "fit", *runs, "--out", str(out),
                               "--method", args.method], capture_output=True, text=True)
        wall = time.perf_counter() - t0
        peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(proc.stdout, end="")
        print(proc.stderr, end="", file=sys.stderr)
        print(f"commcal fit: exit {proc.returncode}, {wall:.1f} s wall, peak RSS {peak_mib:.0f} MiB")
        return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
