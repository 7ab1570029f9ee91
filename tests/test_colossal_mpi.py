"""Colossal-AI's tensor-parallel linear layers on real mpirun jobs (`commcal validate --strategies cai,cai-sbp`):
1D on 2 ranks, 2D on a 2x2 mesh (4 ranks), 2.5D and 3D on a 2x2x2 mesh (8 ranks, oversubscribed). Every schedule's
outputs and gradients match the single-process reference, the bytes its ranks handed to collectives are the bytes
priced and the hand count of the published algorithm, and each grid runs beside its SBP equivalent between the same
placements, whose bytes the harness counts as well."""

import json

import pandas as pd
import pytest

from analysis.harness import TOLERANCE
from calib.synthetic import synthetic_calibration
from conftest import run_mpi

pytestmark = pytest.mark.mpi
OPS = ("allreduce", "allgather", "reduce_scatter", "alltoall", "bcast", "reduce")
FAST = ["--budget", "0.005", "--min-samples", "2", "--target-ci", "0.5", "--bootstrap", "50", "--rounds", "1",
        "--refine-rounds", "0"]
M, K, N, ISZ = 16, 8, 12, 4


def calibration(path, ops=OPS) -> str:
    models = {(op, "intra"): (5e-6, 1e-9) for op in ops}
    path.write_text(json.dumps(synthetic_calibration(models, links={"intra": [2, 4, 8]},
                                                     gemm={"float32": 1e10, "float64": 5e9})))
    return str(path)


def hand_bytes(kind: str, q: int) -> int:
    """Bytes per rank handed to collectives in one forward and backward, by the algorithms' definitions."""
    mk, kn, mn = M * K, K * N, M * N
    return ISZ * {
        "cai-1d-col": mk,                                  # one allreduce of dX [m,k]
        "cai-1d-row": mn,                                  # one allreduce of Y [m,n]
        "cai-2d": 3 * q * (mk + kn) // q ** 2,             # 3 products x q steps x (an X block, a W block)
        # 2 x 2 x 2: blocks of X 1/8, of W 1/4; 3 products x 2 steps; then dW's block allreduced over depth
        "cai-2.5d": 3 * 2 * (mk // 8 + kn // 4) + kn // 4,
        # allgathers of X, W, dY (their local eighths), reduce-scatters of Y, dX, dW (their gathered quarters)
        "cai-3d": (mk + kn + mn) // 8 + (mn + mk + kn) // 4,
    }[kind]


@pytest.mark.parametrize("ranks,mesh,grids", [(2, "2", ("cai-1d-col", "cai-1d-row")), (4, "2x2", ("cai-2d",)),
                                              (8, "2x2x2", ("cai-2.5d", "cai-3d"))])
def test_grids_and_their_sbp_equivalents_run_with_correct_numerics_and_priced_bytes(tmp_path, ranks, mesh, grids):
    cal, out = calibration(tmp_path / "cal.json"), tmp_path / "val"
    proc = run_mpi(ranks, ["validate", cal, "--mesh", mesh, "--out", str(out), "--layer", f"linear:m={M},k={K},n={N}",
                           "--strategies", "cai,cai-sbp", *FAST], check=True, timeout=400)
    assert "numerics ok" in proc.stdout
    frame = pd.read_parquet(out / "strategies.parquet").set_index("strategy")
    twins = [s for s in frame.index if "@" in s]
    assert sorted(s for s in frame.index if "@" not in s) == sorted(grids)
    assert sorted(t.split("@")[1] for t in twins) == sorted(grids)
    assert (frame["max_rel_err"] <= TOLERANCE["float32"]).all()
    assert (frame["sent_bytes"] == frame["comm_bytes"]).all()           # what ran is what was priced
    q = int(mesh.split("x")[0])
    for g in grids:
        assert frame.loc[g, "comm_bytes"] == hand_bytes(g, q), g
    assert (frame["measured_comm_s"] > 0).all() and (frame["predicted_comm_s"] > 0).all()
    steps = pd.read_parquet(out / "steps.parquet")
    calls = steps[steps["op"] != "compute"]
    if "cai-2d" in grids or "cai-2.5d" in grids:
        rooted = calls[calls["op"].isin(["bcast", "reduce"])]
        assert len(rooted) == {"2x2": 12, "2x2x2": 12}[mesh] and (rooted["measured_s"] > 0).all()
        summary = json.loads((out / "summary.json").read_text())
        assert {r["op"] for r in summary["step_ratios"]} >= {"bcast", "reduce"}


def test_a_layer_without_the_strategies_asked_for_and_a_missing_bcast_model_are_one_line(tmp_path):
    cal = calibration(tmp_path / "cal.json", OPS[:4])
    for ranks, mesh, args, says in (
            (2, "2", ["--layer", "embedding:vocab=16,dim=8,tokens=16", "--strategies", "cai"],
             "layer embedding.embed has none of the strategies --strategies cai picks on mesh 2"),
            (1, "1x1", ["--layer", "linear:m=8,k=8,n=8", "--strategies", "cai-2d"], "has no bcast model on any link")):
        proc = run_mpi(ranks, ["validate", cal, "--mesh", mesh, "--out", str(tmp_path / "v"), *args, *FAST])
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = [l for l in proc.stderr.splitlines() if l.startswith("commcal: error")]
        assert len(lines) == 1 and says in lines[0] and "Traceback" not in proc.stderr, proc.stderr
