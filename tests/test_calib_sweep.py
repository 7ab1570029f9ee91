"""A real 2-rank `commcal sweep` fitted end to end: the calibration validates, predicts and tabulates."""

from __future__ import annotations

import json

import jsonschema
import pytest

from calib.calibration import json_schema, load_calibration
from conftest import run_cli, run_main, run_mpi

pytestmark = pytest.mark.mpi


def test_real_sweep_fits_predicts_and_tabulates(tmp_path):
    run = tmp_path / "run"
    run_mpi(2, ["sweep", "--quick", "--ops", "allreduce,pingpong,gemm", "--out", str(run)], check=True)
    cal_path = tmp_path / "cal.json"
    fit = run_cli(["fit", str(run), "--out", str(cal_path)])
    assert fit.returncode == 0, fit.stderr
    assert "med>=4K" in fit.stdout and "p2p pingpong intra" in fit.stdout
    data = json.loads(cal_path.read_text())
    jsonschema.validate(data, json_schema())
    meta = json.loads((run / "run.json").read_text())
    assert data["provenance"]["run_ids"] == [meta["run_id"]]
    cal = load_calibration(cal_path)
    assert cal.backend == "mpi" and cal.link_classes()["intra"]["procs"] == [2]
    pred = cal.predict("allreduce", "intra", 2, 2 ** 20)
    assert pred.seconds > 0 and not pred.extrapolated and pred.low_s <= pred.seconds <= pred.high_s
    assert data["p2p"]["pingpong"]["intra"]["beta_s_per_byte"] > 0
    assert cal.gemm_flops_per_s("float64") > 1e6
    out = run_cli(["predict", str(cal_path), "--op", "allreduce", "--link", "intra", "--procs", "4", "--bytes", "1M"])
    assert out.returncode == 0 and "not measured" in out.stdout
    table = run_cli(["table", str(cal_path), "--format", "csv"])
    assert table.returncode == 0 and "allreduce,intra" in table.stdout


def test_a_one_rank_sweep_fits_hockney_rows_but_no_collective_model(tmp_path, capsys):
    """At p=1 every algorithm shape is 0: the fit keeps the p=1 Hockney line and says there is no model
    (a GPU node's single-rank NCCL sweep once produced a rank-deficient fit and NaN in the file)."""
    run = tmp_path / "run"
    run_mpi(1, ["sweep", "--quick", "--procs", "1", "--ops", "allreduce,bcast", "--out", str(run)], check=True)
    cal_path = tmp_path / "cal.json"
    code, _, err = run_main(capsys, ["fit", str(run), "--out", str(cal_path)])
    assert code == 0, err
    assert "allreduce/intra: only one process measured; no collective model" in err
    cal = load_calibration(cal_path)
    assert not cal.has("allreduce", "intra") and not cal.has("bcast", "intra")
    rows = [r for r in cal.data["hockney"] if r["op"] == "allreduce"]
    assert rows and {r["procs"] for r in rows} == {1}
    assert min(rows, key=lambda r: r["min_bytes"])["alpha_s"] > 0      # small sizes: latency, a copy at most
    code, _, err = run_main(capsys, ["table", str(cal_path)])
    assert code == 0, err
