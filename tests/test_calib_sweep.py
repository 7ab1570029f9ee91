"""A real 2-rank `commcal sweep` fitted end to end: the calibration validates, predicts and tabulates."""

from __future__ import annotations

import json

import jsonschema
import pytest

from calib.calibration import json_schema, load_calibration
from conftest import run_cli, run_mpi

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
