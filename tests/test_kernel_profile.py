"""Compute profiles: the file round-trips and every malformed one is one line and exit 2; pricing takes a profiled
kernel's time and the roofline for the rest, in search, predict and validate alike; and on real MPI ranks `commcal
profile` times every kernel a network's strategies run, at the shapes validate runs them, within a factor of the times
validate itself measures for them."""

import json
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from analysis.kernel_profile import Kernel, KernelKey, Profile, load_profile, profile_from_dict, write_profile
from analysis.layers import Compute
from analysis.mesh import parse_mesh
from analysis.models import parse_model
from analysis.paradl import network_options
from analysis.pricing import Pricer
from analysis.search import Tabulator
from calib.calibration import load_calibration
from calib.synthetic import synthetic_calibration
from conftest import run_main, run_mpi
from microbench.errors import UsageError
from microbench.provenance import STEAL_WARN

CNN = "cnn:batch=4,image=8,channels=4,convs=8-p,dense=8"
OPS = ("allreduce", "allgather", "reduce_scatter", "alltoall", "sendrecv", "pingpong")


def calibration(path) -> str:
    models = {(op, "intra"): (5e-6, 1e-9) for op in OPS}
    path.write_text(json.dumps(synthetic_calibration(models, links={"intra": [2, 4]},
                                                     gemm={"float32": 1e10, "float64": 5e9})))
    return str(path)


@pytest.fixture
def cal(tmp_path) -> str:
    return calibration(tmp_path / "cal.json")


def computes(cal: str, spec: str, mesh: str, names: list[str]) -> list[Compute]:
    """The Compute steps of `spec`'s network strategies on `mesh`, in order."""
    opts = network_options(parse_model(spec), names, Tabulator(Pricer(load_calibration(cal), parse_mesh(mesh))))
    return [st for i in range(len(names)) for st in opts.steps(i) if isinstance(st, Compute)]


def profile_of(steps, seconds: float = 1e-3) -> Profile:
    keys = dict.fromkeys(KernelKey.of(st, "float32") for st in steps)
    return Profile(tuple(Kernel(k, seconds * (i + 1), 5, 0.1) for i, k in enumerate(keys)), 2, 2, ("h",), "now",
                   "cache", "nohugepage")


def test_a_profile_round_trips_and_prices_its_kernels_in_place_of_the_roofline(tmp_path, cal):
    steps = computes(cal, CNN, "2", ["data", "filter"])
    half = profile_of(steps[: len(steps) // 2])
    path = write_profile(half, tmp_path / "p.json")
    back = load_profile(path)
    assert back.kernels == half.kernels and back.ranks == 2 and back.path == str(path)
    c = load_calibration(cal)
    with_p, rates = Pricer(c, parse_mesh("2"), profile=back), Pricer(c, parse_mesh("2"))
    for st in steps:
        want = back.seconds(st, "float32")
        assert with_p.step_seconds(st) == (want if want is not None else rates.step_seconds(st))
    hit = sum(back.seconds(st, "float32") is not None for st in steps)
    assert 0 < hit < len(steps) and with_p.profiled(steps) == (hit, len(steps))
    comm, compute = with_p.price([steps])
    assert compute[0] == pytest.approx(sum(with_p.step_seconds(st) for st in steps)) and comm[0] == 0
    assert Pricer(c, parse_mesh("2"), "float64", profile=back).profiled(steps) == (0, len(steps))  # other dtype


def good() -> dict:
    return {"format": "commcal-profile", "version": 1, "created": "x", "ranks": 2, "ranks_per_node": 2,
            "hosts": ["a"], "allocator": "cache", "page_policy": "nohugepage", "backend": "mpi",
            "kernels": [{"expr": "Y = W @ cols", "operands": [[4, 8], [2, 4]], "out": [2, 8], "dtype": "float32",
                         "median_s": 1e-4, "samples": 3, "spread": 0.0}]}


def mutated(path: str, value):
    d = good()
    obj, keys = d, path.split(".")
    for k in keys[:-1]:
        obj = obj[int(k)] if isinstance(obj, list) else obj[k]
    if value is KeyError:
        del obj[keys[-1]]
    else:
        obj[keys[-1]] = value
    return d


@pytest.mark.parametrize("path,value,says", [
    ("format", "commcal-calibration", "not a compute profile"), ("version", 2, "version 2"),
    ("kernels", {}, "kernels is not a list"), ("kernels.0.median_s", -1.0, "positive"),
    ("kernels.0.median_s", math.nan, "non-finite"), ("kernels.0.median_s", math.inf, "non-finite"),
    ("kernels.0.median_s", True, "positive"), ("kernels.0.median_s", 0, "positive"),
    ("kernels.0.operands", [[4, -8]], "operand"), ("kernels.0.out", KeyError, "out"),
    ("kernels.0.samples", 0, "samples"), ("kernels.0.spread", "x", "spread"), ("ranks", 0, "ranks"),
    ("hosts", "a", "hosts"), ("kernels.0.expr", 3, "strings"), ("backend", KeyError, "backend"),
    ("cpu_steal", [0.1], "cpu_steal"), ("cpu_steal", {"n1": 1.5}, "cpu_steal"),
    ("cpu_steal", {"n1": "x"}, "cpu_steal")])
def test_every_malformed_profile_is_one_line_and_exit_2(tmp_path, capsys, cal, path, value, says):
    profile_from_dict(good())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(mutated(path, value)))
    with pytest.raises(UsageError, match=says):
        load_profile(bad)
    code, out, err = run_main(capsys, ["search", cal, "--model", CNN, "--mesh", "2", "--profile",
                                       str(bad)])
    assert code == 2 and err.count("\n") == 1 and err.startswith("commcal: error: ") and str(bad) in err


def test_unreadable_profiles_are_one_line(tmp_path, capsys, cal):
    (tmp_path / "t.json").write_text("{not json")
    for name in ("t.json", "missing.json"):
        code, _, err = run_main(capsys, ["predict", cal, "--layer", "linear:m=8,k=8,n=8", "--strategy",
                                         "m", "--mesh", "2", "--profile", str(tmp_path / name)])
        assert code == 2 and err.count("\n") == 1 and "profile" in err


def test_search_and_predict_price_compute_by_the_profile_and_say_how_much(tmp_path, capsys, cal):
    steps = computes(cal, CNN, "2", ["data"])
    path = write_profile(profile_of(steps, 0.25), tmp_path / "p.json")
    code, out, err = run_main(capsys, ["search", cal, "--model", CNN, "--mesh", "2", "--json",
                                       "--profile", str(path)])
    assert code == 0
    got = json.loads(out)
    assert got["profile"]["path"] == str(path) and 0 < got["profile"]["profiled"] < got["profile"]["compute_steps"]
    assert "has " in err and "compute steps' kernels" in err          # the rest by the rates, said once
    assert "rank(s) per node" not in err and got["profile"]["ranks_per_node"] == 2
    code, _, err = run_main(capsys, ["search", cal, "--model", CNN, "--mesh", "2", "--ranks-per-node", "1",
                                     "--profile", str(path)])
    assert code == 0 and "timed its kernels with 2 rank(s) per node computing at once, the mesh has 1" in err
    gpu = write_profile(replace(profile_of(steps), backend="nccl"), tmp_path / "gpu.json")
    code, _, err = run_main(capsys, ["search", cal, "--model", CNN, "--mesh", "2", "--profile", str(gpu)])
    assert code == 0 and "with backend 'nccl', the calibration is of 'mpi'" in err and "cpu_steal" not in err
    stolen = write_profile(replace(profile_of(steps), cpu_steal=(("n1", 0.3), ("n2", None))), tmp_path / "s.json")
    assert load_profile(stolen).cpu_steal == (("n1", 0.3), ("n2", None))
    code, out, err = run_main(capsys, ["search", cal, "--model", CNN, "--mesh", "2", "--json", "--profile",
                                       str(stolen)])
    assert code == 0 and "(cpu_steal: n1 30%)" in err and json.loads(out)["profile"]["cpu_steal"]["n1"] == 0.3
    data = next(r for r in got["paradl"] if r["strategy"] == "data")
    assert data["compute_s"] >= 0.25 * len({KernelKey.of(st, "float32") for st in steps})  # the profile's times
    code, out, _ = run_main(capsys, ["predict", cal, "--layer", "linear:m=8,k=8,n=8", "--strategy", "m",
                                     "--mesh", "2", "--json", "--profile", str(path)])
    rows = [r for r in json.loads(out)["steps"] if r["kind"] == "compute"]
    assert code == 0 and rows and not any(r["profiled"] for r in rows)   # a linear layer's kernels are not in it


@pytest.mark.mpi
def test_profile_times_every_kernel_validate_runs_near_what_validate_measures(tmp_path, capsys, cal):
    prof, out = tmp_path / "p.json", tmp_path / "v"
    run_mpi(2, ["profile", "--model", CNN, "--mesh", "2", "--out", str(prof)], check=True)
    profile = load_profile(prof)
    assert profile.ranks == 2 and all(k.median_s > 0 and k.samples >= 15 for k in profile.kernels)
    code, text, err = run_main(capsys, ["search", cal, "--model", CNN, "--mesh", "2", "--json", "--profile", str(prof)])
    got = json.loads(text)["profile"]                          # every strategy search weighs is profiled
    warnings = [line for line in err.splitlines() if "warning" in line and "the hypervisor took CPU time" not in line]
    assert code == 0 and got["profiled"] == got["compute_steps"] > 0 and not warnings, err   # steal: the host's
    run_mpi(2, ["validate", cal, "--model", CNN, "--mesh", "2", "--strategies",
                "data,filter,channel,spatial,pipeline", "--profile", str(prof), "--out", str(out), "--budget", "0.05",
                "--rounds", "2", "--refine-rounds", "0", "--bootstrap", "20"], check=True)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["profile"]["profiled"] == summary["profile"]["compute_steps"] > 0     # every kernel profiled
    assert not any("commcal profile" in line for line in summary["calibration_advice"])
    steps = pd.read_parquet(out / "steps.parquet")
    comp = steps[steps["op"] == "compute"]
    keyed = {st.expr for st in computes(cal, CNN, "2", ["data", "filter", "channel", "spatial"])}
    assert set(comp["what"]) == keyed
    medians = {(k.key.expr, k.median_s) for k in profile.kernels}
    assert all((w, p) in medians for w, p in zip(comp["what"], comp["predicted_s"]))      # priced by the profile
    frame = pd.read_parquet(out / "strategies.parquet")
    pipe = frame[frame["strategy"] == "pipeline"]
    assert len(pipe) == 1 and pipe["predicted_s"].item() > 0
    # timed at validate's shapes on the same ranks, the kernels that take most time (the longest quarter of the steps
    # by their profiled time: ranked, not cut at a time that more or fewer kernels pass on a faster or slower host)
    # agree within a factor
    big = comp.nlargest(len(comp) // 4, "predicted_s")
    ratio = float(np.median(big["measured_s"] / big["predicted_s"]))
    steal = [f for f in [*dict(profile.cpu_steal).values(), *summary["cpu_steal"].values()] if f is not None]
    print(f"validate ran the profiled kernels at {ratio:.3f}x their profiled time; steal {steal}")
    assert len(big) >= 10 and set(dict(profile.cpu_steal)) == set(profile.hosts), profile.cpu_steal
    if max(steal, default=0.0) > STEAL_WARN:
        pytest.skip(f"the hypervisor took {max(steal):.0%} of a host's CPU while profile or validate timed: "
                    f"kernels timed under steal do not judge each other ({ratio:.3f}x)")
    assert 0.5 < ratio < 2.0, ratio


def test_profile_refuses_what_it_cannot_run(capsys):
    for args, says in ((["--mesh", "2", "--out", "x"], "--model"),
                       (["--model", CNN, "--mesh", "2", "--samples", "1", "--out", "x"], "--samples"),
                       (["--model", CNN, "--mesh", "2", "--strategies", "sideways", "--out", "x"], "sideways"),
                       (["--layer", "embedding:vocab=8,dim=4,tokens=8", "--mesh", "2", "--out", "x"], "embedding"),
                       (["--model", CNN, "--mesh", "2x", "--out", "x"], "mesh")):
        code, _, err = run_main(capsys, ["profile", *args])
        assert code == 2 and err.count("\n") == 1 and says in err, err
