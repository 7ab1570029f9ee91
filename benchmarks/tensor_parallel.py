"""Colossal-AI's tensor-parallel linear layers against the SBP strategy that computes the same thing between the same
placements (analysis.colossal.framed): per grid strategy, the words its collectives move over all ranks, the bytes
per rank handed to collectives, the predicted communication time from the calibration, and, from a `commcal validate
--strategies cai,cai-sbp` directory of the same layer and mesh, the bytes the harness counted and the measured
communication time.
Run: python -m benchmarks.tensor_parallel CAL --layer linear:m=..,k=..,n=.. --mesh 2x2 [--ranks-per-node N]
[--validate DIR]."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from analysis import colossal
from analysis import strategies as tp
from analysis.mesh import parse_mesh
from analysis.models import parse_model
from analysis.options import fmt_s
from analysis.pricing import Pricer
from microbench.errors import UsageError
from benchmarks import benchmark_parser


def rows(cal, layer, mesh) -> list[dict]:
    """Each grid strategy of the layer on the mesh and its SBP equivalent: words moved, bytes per rank, predicted
    communication seconds."""
    pricer = Pricer(cal, mesh)
    out = []
    for s in tp.strategies(layer, mesh):
        if tp.family(s) == "sbp":
            continue
        sc = tp.schedule(layer, s, mesh)
        comm, _ = pricer.price([sc.steps])
        out.append({"strategy": s.id, "words": colossal.words_moved(sc.steps, mesh, layer.itemsize),
                    "comm_bytes": sum(e.bytes_per_rank for e in sc.steps if e.is_comm), "predicted_comm_s": comm[0]})
    return out


def main(argv=None) -> int:
    p = benchmark_parser("benchmarks.tensor_parallel", __doc__)
    p.add_argument("calibration")
    p.add_argument("--layer", required=True, help="a linear layer, e.g. linear:m=1024,k=1024,n=1024")
    p.add_argument("--mesh", required=True, help="the grid: p, qxq, dxqxq or qxqxq")
    p.add_argument("--ranks-per-node", type=int, default=None)
    p.add_argument("--validate", default=None, help="a validate directory of the same layer and mesh")
    args = p.parse_args(argv)
    from calib.calibration import load_calibration

    try:
        cal = load_calibration(args.calibration)
        mesh = parse_mesh(args.mesh, args.ranks_per_node)
        layers = parse_model(args.layer).layers
        table = pd.DataFrame(rows(cal, layers[0], mesh))
        if len(layers) != 1 or table.empty:
            raise UsageError(f"{args.layer} on mesh {args.mesh}: give one linear layer and a mesh of a grid's shape")
    except UsageError as exc:
        print(f"tensor_parallel: {exc}", file=sys.stderr)
        return 2
    cols = ["strategy", "words", "comm_bytes", "predicted_comm_s"]
    if args.validate:
        got = pd.read_csv(Path(args.validate) / "strategies.csv")[["strategy", "sent_bytes", "measured_comm_s"]]
        table = table.merge(got, on="strategy", how="left")
        cols += ["sent_bytes", "measured_comm_s"]
    print(f"{args.layer} on mesh {mesh}; calibration {args.calibration}")
    print(f"{'strategy':<22} {'words moved':>12} {'B/rank':>10} {'predicted':>11}"
          + (f" {'sent B/rank':>12} {'measured':>11}" if args.validate else ""))
    for r in table[cols].itertuples(index=False):
        line = f"{r.strategy:<22} {r.words:>12,.0f} {r.comm_bytes:>10,} {fmt_s(r.predicted_comm_s):>11}"
        if args.validate:
            line += f" {r.sent_bytes:>12,.0f} {fmt_s(r.measured_comm_s):>11}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
