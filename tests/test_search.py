"""Chain search: DP equals brute force, coordinate descent never beats it, memory cap, CLI errors, and link classes
that the calibration lacks: one stderr line per (wanted, used) pair, a JSON record each, exit 2 under --strict."""

from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
import pytest

from analysis.mesh import Mesh
from analysis.models import parse_model
from analysis.pricing import Fallback, Pricer
from analysis.search import (Tabulator, cap_bound, chain_cost, coordinate_descent, dp, evaluate_many, memory_of,
                             optimum)
from calib.calibration import calibration_from_dict, load_calibration
from calib.synthetic import synthetic_calibration
from microbench.errors import UsageError
from conftest import run_cli, run_main

OPS = ("allreduce", "allgather", "reduce_scatter", "alltoall")


def cal_dict():
    models = {(op, link): (a, 1 / bw) for op in OPS
              for link, a, bw in (("intra", 5e-6, 100e9), ("inter", 20e-6, 12e9), ("spread", 25e-6, 10e9))}
    return synthetic_calibration(models, gemm={"float32": 1e13, "float64": 5e12})


def intra_only(path, ops=OPS) -> str:
    """A calibration file with intra-node models of `ops` only."""
    path.write_text(json.dumps(synthetic_calibration({(op, "intra"): (5e-6, 1e-11) for op in ops},
                                                     gemm={"float32": 1e13})))
    return str(path)



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


def test_a_binding_memory_cap_is_bounded_by_the_best_assignment_within_it(tables):
    """Where the cap binds, optimum() is not exact: the brute-force fastest assignment within the cap lies between
    cap_bound and optimum()'s answer, so the gap the search prints is an upper bound of its real distance."""
    sizes = [len(o.strategies) for o in tables.options]
    every = np.array(list(itertools.product(*[range(n) for n in sizes])))
    costs = evaluate_many(tables, every)
    memory = np.array([memory_of(tables, c) for c in every])
    free, _ = optimum(tables)
    caps = [share * memory_of(tables, free) for share in (0.95, 0.8, 0.6)]
    caps = [cap for cap in caps if (memory <= cap).any()]
    assert caps
    for cap in caps:
        capped, lam = optimum(tables, cap)
        best = costs[memory <= cap].min()
        assert lam > 0
        assert cap_bound(tables, lam, cap) <= best * (1 + 1e-12) <= chain_cost(tables, capped) * (1 + 1e-12)


def test_a_binding_cap_is_said_and_bounded_where_search_prints_it(tmp_path, capsys):
    """The command, where --memory-cap binds: the JSON's optimum is not exact, its bound lies at or under the answer's
    time, the answer fits the cap, and coordinate descent is said to fit it or not as its memory does; the text says
    "memory-capped search", never "exact search". Without a cap: exact, bound = answer."""
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(cal_dict()))
    argv = ["search", str(cal), "--model", "transformer:d=64,heads=4,seq=32,batch=16,layers=4", "--mesh", "2x2"]
    code, text, err = run_main(capsys, [*argv, "--json"])
    free = json.loads(text)
    assert code == 0 and free["optimum"]["exact"] and free["optimum"]["bound_s"] == free["total_s"], err
    cap = int(0.9 * free["memory_bytes"])
    code, text, err = run_main(capsys, [*argv, "--json", "--memory-cap", str(cap)])
    capped = json.loads(text)
    best, cd = capped["optimum"], capped["coordinate_descent"]
    assert code == 0 and not best["exact"] and capped["memory_bytes"] <= cap, err
    assert 0 < best["bound_s"] <= capped["total_s"] * (1 + 1e-12) and best["gap_bound"] >= -1e-12
    assert capped["total_s"] >= free["total_s"] * (1 - 1e-12)
    if best["taken_from"] == "coordinate descent":
        assert cd["fits_memory_cap"] and cd["total_s"] == pytest.approx(capped["total_s"])
    code, text, _ = run_main(capsys, [*argv, "--memory-cap", str(cap)])
    assert "memory-capped search" in text and "exact search" not in text
    assert ("over the memory cap" in text) == (not cd["fits_memory_cap"])


def test_search_cli_json_and_errors(tmp_path):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(cal_dict()))
    ok = run_cli(["search", str(cal), "--model", "vgg13", "--mesh", "2x2", "--json", "--top", "2", "--strict"],
                 timeout=120)
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr        # every class the mesh needs: no fallback
    out = json.loads(ok.stdout)
    assert out["fallbacks"] == []
    assert out["total_s"] > 0 and out["total_s"] == pytest.approx(out["compute_s"] + out["comm_s"], rel=1e-9)
    assert {r["layer"] for r in out["layers"]} >= {"fc1", "fc2", "fc3"}
    for args, words in ((["--model", "vgg13", "--mesh", "2x4", "--devices", "6"], "devices"),
                        (["--model", "nosuch", "--mesh", "2x2"], "unknown model"),
                        (["--model", "linear:m=3,k=5,n=7", "--mesh", "2x2", "--ranks-per-node", "3"], "ranks per node"),
                        (["--model", "vgg13", "--mesh", "1000000x1000000"], "more than 1048576 devices"),
                        (["--model", "vgg13", "--mesh", "2x2x2x2x2x2"], "6 axes")):
        bad = run_cli(["search", str(cal), *args], timeout=120)
        assert bad.returncode == 2 and words in bad.stderr and "Traceback" not in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1


def test_predict_strategy_rejects_indivisible_split():
    import argparse

    from analysis.predict_cmd import add_strategy_arguments, run_strategy
    p = argparse.ArgumentParser()
    add_strategy_arguments(p)
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


def test_pricer_records_fallbacks_as_frozen_values(tmp_path):
    """Mesh 2x4 on an intra-only calibration without alltoall: axis 0 (inter) takes the intra models, alltoall
    has none anywhere (None, priced infinite); only the pairs of the given steps where steps are given."""
    pricer = Pricer(load_calibration(intra_only(tmp_path / "c.json", OPS[:3])), Mesh((2, 4), 4))
    tables = Tabulator(pricer).tables(parse_model("mlp:batch=64,d_in=64,d_hidden=256"))
    found = pricer.fallbacks()
    assert found == sorted(found, key=lambda f: (f.axis, f.op)) and len(set(found)) == len(found)
    assert set(found) == {Fallback(op, 0, "inter", "intra") for op in OPS[:3]} | {
        Fallback("alltoall", 0, "inter", None), Fallback("alltoall", 1, "intra", None)}
    assert found[0].to_dict() == {"op": "allgather", "axis": 0, "wanted": "inter", "used": "intra"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        found[0].used = "inter"
    fc1 = tables.options[0]
    assert pricer.fallbacks(fc1.schedules[[s.id for s in fc1.strategies].index("-.-")].steps) == []
    full = Pricer(calibration_from_dict(cal_dict()), Mesh((2, 4), 4))
    Tabulator(full).tables(parse_model("mlp:batch=64,d_in=64,d_hidden=256"))
    assert full.fallbacks() == []


def test_search_says_each_fallback_once_records_it_and_strict_refuses(tmp_path, capsys):
    cal = intra_only(tmp_path / "intra.json")
    args = ["search", cal, "--model", "vgg13", "--mesh", "2x4", "--json"]
    code, out, err = run_main(capsys, args)
    assert code == 0, err
    out = json.loads(out)
    ops = sorted({f["op"] for f in out["fallbacks"]})
    assert "allreduce" in ops and len(ops) == len(out["fallbacks"])
    assert all(f == {"op": f["op"], "axis": 0, "wanted": "inter", "used": "intra"} for f in out["fallbacks"])
    assert err == (f"commcal: warning: calibration {cal} has no 'inter' model for {', '.join(ops)} (mesh axis 0); "
                   "priced by its 'intra' models\n")
    assert all(key.endswith("/intra") for key in out["comm_by_collective"])
    code, out, err = run_main(capsys, [*args, "--strict"])
    assert code == 2 and out == ""
    assert err == (f"commcal: error: calibration {cal} has no 'inter' model for {', '.join(ops)} (mesh axis 0); "
                   "--strict refuses to fall back\n")


def test_search_says_which_collectives_no_link_class_prices(tmp_path, capsys):
    cal = intra_only(tmp_path / "no-alltoall.json", OPS[:3])
    code, out, err = run_main(capsys, ["search", cal, "--model", "mlp:batch=64,d_in=64,d_hidden=256", "--mesh", "2x4",
                                   "--json"])
    assert code == 0, err
    assert err.splitlines() == [
        f"commcal: warning: calibration {cal} has no 'inter' model for allgather, allreduce, reduce_scatter "
        "(mesh axis 0); priced by its 'intra' models",
        f"commcal: warning: calibration {cal} has no model for alltoall on any link class (mesh axis 0 wants "
        "'inter'); priced infinite",
        f"commcal: warning: calibration {cal} has no model for alltoall on any link class (mesh axis 1 wants "
        "'intra'); priced infinite"]
    out = json.loads(out)
    assert {"op": "alltoall", "axis": 1, "wanted": "intra", "used": None} in out["fallbacks"]
    assert np.isfinite(out["total_s"]) and not any(k.startswith("alltoall") for k in out["comm_by_collective"])


def test_predict_says_its_fallback_and_strict_refuses(tmp_path, capsys):
    """predict --op and --layer: the link class asked for (or the mesh axis's) is absent, intra prices it; a layer
    strategy reports only its own collectives' fallbacks; --strict is one line, exit 2, nothing printed."""
    cal = intra_only(tmp_path / "intra.json")
    op = ["predict", cal, "--op", "allreduce", "--link", "inter", "--procs", "2", "--bytes", "1M", "--json"]
    code, out, err = run_main(capsys, op)
    assert code == 0 and json.loads(out)["link"] == "intra"
    assert json.loads(out)["fallbacks"] == [{"op": "allreduce", "axis": None, "wanted": "inter", "used": "intra"}]
    assert err == (f"commcal: warning: calibration {cal} has no 'inter' model for allreduce; priced by its 'intra' "
                   "models\n")
    layer = ["predict", cal, "--layer", "linear:m=64,k=128,n=256", "--mesh", "2", "--ranks-per-node", "1", "--json"]
    code, out, err = run_main(capsys, [*layer, "--strategy", "m"])           # data parallel: one gradient allreduce
    assert code == 0 and [s["priced_link"] for s in json.loads(out)["steps"] if s["kind"] == "comm"] == ["intra"]
    assert json.loads(out)["fallbacks"] == [{"op": "allreduce", "axis": 0, "wanted": "inter", "used": "intra"}]
    assert err == (f"commcal: warning: calibration {cal} has no 'inter' model for allreduce (mesh axis 0); "
                   "priced by its 'intra' models\n")
    code, out, err = run_main(capsys, [*layer, "--strategy", "-"])            # replicated: no collective, no fallback
    assert code == 0 and err == "" and json.loads(out)["fallbacks"] == []
    for args in (op, [*layer, "--strategy", "m"]):
        code, out, err = run_main(capsys, [*args, "--strict"])
        assert code == 2 and out == "" and err.count("\n") == 1
        assert err.startswith(f"commcal: error: calibration {cal} has no 'inter' model for allreduce")
        assert err.endswith("; --strict refuses to fall back\n")
    full = tmp_path / "full.json"
    full.write_text(json.dumps(cal_dict()))
    code, out, err = run_main(capsys, ["predict", str(full), *layer[2:], "--strategy", "m", "--strict"])
    assert code == 0 and err == "" and json.loads(out)["fallbacks"] == []


def test_coordinate_descent_returns_a_choice_where_every_start_is_infinite(tmp_path):
    """No collective has a model: only the replicated chain is finite, and descent from the starts may never reach
    it; it still returns its best (infinite) assignment rather than nothing."""
    data = synthetic_calibration({("pingpong", "intra"): (5e-6, 1e-11)}, gemm={"float32": 1e13})
    tables = Tabulator(Pricer(calibration_from_dict(data), Mesh((2, 4), 4))).tables(
        parse_model("transformer:d=256,heads=4,seq=64,batch=4"))
    assert np.isfinite(dp(tables)[1])
    cd = coordinate_descent(tables, restarts=2)
    assert cd is not None and chain_cost(tables, cd) >= dp(tables)[1]


def test_a_mesh_whose_strategy_pairs_would_take_minutes_is_refused_before_planning(monkeypatch):
    """The transitions' strategy pairs are counted before any is planned (shared shapes once): over MAX_PAIRS the
    search is one line naming the count, not minutes and gigabytes; at it, the same model is searched."""
    import analysis.search as search

    model = parse_model("mlp:batch=256,d_in=512,d_hidden=1024")
    tab = Tabulator(Pricer(calibration_from_dict(cal_dict()), Mesh((2, 2), 2)))
    options = [tab.options(layer, i > 0) for i, layer in enumerate(model.layers)]
    pairs = sum(len(a.strategies) * len(b.strategies) for a, b in zip(options, options[1:]))
    monkeypatch.setattr(search, "MAX_PAIRS", pairs - 1)
    with pytest.raises(UsageError, match=f"has {pairs} strategy pairs"):
        tab.tables(model)
    monkeypatch.setattr(search, "MAX_PAIRS", pairs)
    assert len(tab.tables(model).transitions) == len(options) - 1
