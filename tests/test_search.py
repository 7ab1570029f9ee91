"""Chain search: DP equals brute force, coordinate descent never beats it, memory cap, CLI errors."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from analysis.mesh import Mesh
from analysis.models import parse_model
from analysis.pricing import Pricer
from analysis.search import Tabulator, chain_cost, coordinate_descent, dp, evaluate_many, memory_of, optimum
from calib.calibration import calibration_from_dict
from calib.synthetic import synthetic_calibration
from microbench.errors import UsageError
from conftest import run_cli

OPS = ("allreduce", "allgather", "reduce_scatter", "alltoall")


def cal_dict():
    models = {(op, link): (a, 1 / bw) for op in OPS
              for link, a, bw in (("intra", 5e-6, 100e9), ("inter", 20e-6, 12e9), ("spread", 25e-6, 10e9))}
    return synthetic_calibration(models, gemm={"float32": 1e13, "float64": 5e12})


@pytest.fixture(scope="module")
def tables():
    pricer = Pricer(calibration_from_dict(cal_dict()), Mesh((2, 2), 2))
    return Tabulator(pricer).tables(parse_model("mlp:batch=256,d_in=512,d_hidden=1024"))


def test_dp_equals_brute_force(tables):
    sizes = [len(o.strategies) for o in tables.options]
    every = np.array(list(itertools.product(*[range(n) for n in sizes])))
    costs = evaluate_many(tables, every)
    choice, value = dp(tables)
    assert value == pytest.approx(costs.min(), rel=1e-12)
    assert chain_cost(tables, choice) == pytest.approx(value, rel=1e-12)
    assert coordinate_descent(tables, restarts=2) is not None
    assert chain_cost(tables, coordinate_descent(tables, restarts=2)) >= value * (1 - 1e-12)


def test_memory_cap_is_met(tables):
    free, _ = optimum(tables)
    cap = 0.8 * memory_of(tables, free)
    capped, lam = optimum(tables, cap)
    assert lam > 0 and memory_of(tables, capped) <= cap
    assert chain_cost(tables, capped) >= chain_cost(tables, free)
    assert optimum(tables, 1.0)[0] is None


def test_search_cli_json_and_errors(tmp_path):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(cal_dict()))
    ok = run_cli(["search", str(cal), "--model", "vgg13", "--mesh", "2x2", "--json", "--top", "2"], timeout=120)
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    assert out["total_s"] > 0 and out["total_s"] == pytest.approx(out["compute_s"] + out["comm_s"], rel=1e-9)
    assert {r["layer"] for r in out["layers"]} >= {"fc1", "fc2", "fc3"}
    for args, words in ((["--model", "vgg13", "--mesh", "2x4", "--devices", "6"], "devices"),
                        (["--model", "nosuch", "--mesh", "2x2"], "unknown model"),
                        (["--model", "linear:m=3,k=5,n=7", "--mesh", "2x2", "--ranks-per-node", "3"], "ranks per node")):
        bad = run_cli(["search", str(cal), *args], timeout=120)
        assert bad.returncode == 2 and words in bad.stderr and "Traceback" not in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1


def test_predict_strategy_rejects_indivisible_split():
    import argparse

    from analysis.predict_strategy import add_arguments, run_strategy
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--layer", "linear:m=6,k=8,n=8", "--strategy", "m.m", "--mesh", "2x2"])
    with pytest.raises(UsageError, match="not divisible"):
        run_strategy(args, calibration_from_dict(cal_dict()))


def test_predict_layer_strategy_cli_prints_plan_and_cost(tmp_path):
    """`commcal predict CAL --layer --strategy --mesh`: data parallelism on 2 ranks is one gradient allreduce of |W|."""
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(cal_dict()))
    proc = run_cli(["predict", str(cal), "--layer", "linear:m=64,k=128,n=256", "--strategy", "m", "--mesh", "2",
                    "--json"])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    comm = [s for s in out["steps"] if s["kind"] == "comm"]
    assert [(s["op"], s["size_bytes"]) for s in comm] == [("allreduce", 128 * 256 * 4)]
    assert out["total_s"] > 0
    proc = run_cli(["predict", str(cal), "--op", "allreduce"])
    assert proc.returncode == 2 and "predict needs --link, --procs, --bytes" in proc.stderr
