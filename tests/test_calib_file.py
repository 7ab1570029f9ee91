"""The calibration file and its commands: synthetic calibrations predict the algorithm formulas, the one loader
rejects bad files naming the key, and fit/predict/table fail on bad input with one line and exit 2."""

from __future__ import annotations

import copy
import json
import math
import warnings

import jsonschema
import numpy as np
import pytest

from calib.calibration import VERSION, calibration_from_dict, json_schema, load_calibration
from calib.synthetic import Segment, TrueModel, synthetic_calibration, write_synthetic_run
from microbench.errors import UsageError
from conftest import run_cli, run_main

ALPHA, BETA = 5e-6, 2e-9


@pytest.fixture
def cal_dict():
    return synthetic_calibration(
        {("allreduce", "inter"): (ALPHA, BETA),
         ("bcast", "intra"): TrueModel.line(1e-6, 1e-10, "binomial_tree"),
         ("pingpong", "inter"): TrueModel((Segment(4096, 2e-6, 3e-9), Segment(math.inf, 9e-6, 1e-9)))},
        links={"inter": [2, 4], "intra": [2, 4, 8]}, gemm={"float32": 3e11})


def test_synthetic_calibration_predicts_the_algorithm_formulas(cal_dict):
    cal = calibration_from_dict(cal_dict)
    assert cal.backend == "mpi" and cal.has("allreduce", "inter") and not cal.has("allreduce", "intra")
    assert cal.link_classes()["inter"]["procs"] == [2, 4]
    for p, n in ((2, 1e3), (4, 64 * 2 ** 20)):
        pred = cal.predict("allreduce", "inter", p, n)
        assert pred.seconds == pytest.approx(2 * (p - 1) * ALPHA + 2 * (p - 1) / p * n * BETA)
        assert not pred.extrapolated and pred.model == "ring" and pred.link == "inter"
    pred = cal.predict("allreduce", "inter", 16, 1e6)
    assert pred.extrapolated and "16" in pred.note
    assert cal.predict("bcast", "intra", 8, 1e6).seconds == pytest.approx(3 * (1e-6 + 1e6 * 1e-10))
    n = np.array([100.0, 4095.0, 4096.0, 1e6])
    want = np.where(n < 4096, 2e-6 + n * 3e-9, 9e-6 + n * 1e-9)
    np.testing.assert_allclose(cal.predict_seconds("pingpong", "inter", 2, n), want)
    np.testing.assert_allclose([cal.predict("pingpong", "inter", 2, x).seconds for x in n], want)
    assert cal.gemm_flops_per_s("float32") == 3e11
    with pytest.raises(UsageError, match="float16"):
        cal.gemm_flops_per_s("float16")
    with pytest.raises(UsageError, match="no model for allreduce"):
        cal.predict("allreduce", "spread", 4, 1e3)


def _mutations():
    def put(path, value):
        def f(d):
            *head, last = path
            for k in head:
                d = d[k]
            d[last] = value
        return f

    def drop(path):
        def f(d):
            *head, last = path
            for k in head:
                d = d[k]
            del d[last]
        return f

    def reverse(path):
        def f(d):
            for k in path:
                d = d[k]
            d.reverse()
        return f

    seg = ["models", "allreduce", "inter", "segments", 0]
    return [
        (put(["version"], VERSION + 1), "'version'"),
        (put(["schema"], "other"), "'schema'"),
        (drop(["provenance"]), "missing key 'provenance'"),
        (drop([*seg, "beta_s_per_byte"]), "missing key 'models.allreduce.inter.segments.0.beta_s_per_byte'"),
        (put([*seg, "alpha_s"], "5us"), "key 'models.allreduce.inter.segments.0.alpha_s' must be of type number"),
        (put([*seg, "speed"], 1.0), "unknown key 'models.allreduce.inter.segments.0.speed'"),
        (put(["extra"], {}), "unknown key 'extra'"),
        (put(["link_classes", "galaxy"], {}), "unknown key 'link_classes.galaxy'"),
        (put(["models", "allreduce", "inter", "procs_measured"], ["2"]), "procs_measured.0"),
        (put(["models", "allreduce", "inter", "algorithm"], "magic"), "'models.allreduce.inter.algorithm' is 'magic'"),
        (put([*seg, "alpha_ci95_s"], [0.0, math.nan]), "key 'models.allreduce.inter.segments.0.alpha_ci95_s.1' is "
                                                       "not a finite number"),
        (put(["models", "allreduce", "inter", "speeds"], dict(SPEEDS, ratios=[1.0])),
         "key 'models.allreduce.inter.speeds': sizes must ascend and ratios give one ratio per size"),
        (put(["models", "allreduce", "inter", "speeds"], dict(SPEEDS, sizes=[1024.0, 8.0])),
         "key 'models.allreduce.inter.speeds': sizes must ascend"),
        (reverse(["models", "pingpong", "inter", "segments"]),
         "key 'models.pingpong.inter.segments.1' spans 8..4096 B: a segment's min_bytes must not exceed its max_bytes, "
         "and each segment must start and end at or above the one before"),
        (put([*seg, "min_bytes"], 2.0 ** 30), "key 'models.allreduce.inter.segments.0' spans "),
        (drop(["link_classes", "inter"]), "key 'models.allreduce.inter' is a model on link class 'inter', which "
                                          "'link_classes' lacks"),
    ]


SPEEDS = {"n_points": 1, "of_points": 2, "max_ratio": 1.5, "max_at_bytes": 1024.0, "max_at_procs": 2,
          "sizes": [8.0, 1024.0], "ratios": [1.0, 1.5]}
"""A version 19 model's speeds (the loader's own checks mutate it)."""


@pytest.mark.parametrize("mutate,message", _mutations())
def test_loader_rejects_bad_files_naming_the_key(cal_dict, tmp_path, mutate, message):
    bad = copy.deepcopy(cal_dict)
    mutate(bad)
    with pytest.raises(UsageError, match=message.replace(".", r"\.")):
        calibration_from_dict(bad)
    if "finite" not in message:  # JSON cannot hold NaN: the file form is test_loader_rejects_unreadable_json's
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(UsageError, match=message.replace(".", r"\.")):
            load_calibration(path)


def test_a_shared_segment_boundary_loads_and_huge_standard_errors_give_an_infinite_interval_without_a_warning(
        cal_dict):
    """A fit's adjacent segments may share a boundary; a standard error whose square overflows is no numpy warning."""
    assert [(s["min_bytes"], s["max_bytes"]) for s in cal_dict["models"]["pingpong"]["inter"]["segments"]] \
        == [(8.0, 4096.0), (4096.0, 2.0 ** 26)]
    for s in cal_dict["models"]["allreduce"]["inter"]["segments"]:
        s.update(alpha_se_s=1e200, beta_se_s_per_byte=1e200)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pred = calibration_from_dict(cal_dict).predict("allreduce", "inter", 4, 1e6)
    assert pred.high_s == math.inf and pred.low_s == 0.0 and math.isfinite(pred.seconds)


def test_table_on_a_bad_file_is_one_line_and_exit_2(cal_dict, tmp_path):
    cal_dict["models"]["allreduce"]["inter"]["segments"][0]["alpha_s"] = "5us"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(cal_dict))
    proc = run_cli(["table", str(path)])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "key 'models.allreduce.inter.segments.0.alpha_s' must be of type number" in proc.stderr


def test_loader_rejects_unreadable_json(tmp_path):
    for text in ("{", '{"version": NaN}', "[]"):
        path = tmp_path / "x.json"
        path.write_text(text)
        with pytest.raises(UsageError):
            load_calibration(path)
    with pytest.raises(UsageError, match="cannot read"):
        load_calibration(tmp_path / "missing.json")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return write_synthetic_run(tmp_path_factory.mktemp("run") / "r", {
        ("allreduce", "inter"): (20e-6, 1e-9), ("pingpong", "inter"): (10e-6, 8e-9)}, {"inter": [2, 4]},
        gemm={"float32": 5e10})


def test_fit_predict_table_end_to_end(run_dir, tmp_path, capsys):
    out = tmp_path / "cal.json"
    code, stdout, err = run_main(capsys, ["fit", str(run_dir), "--out", str(out)])
    assert code == 0, err
    assert "allreduce" in stdout and "pingpong" in stdout
    data = json.loads(out.read_text())
    jsonschema.validate(data, json_schema())
    assert data["provenance"]["runs"][0]["machine"] == "synthetic"
    predict = ["predict", str(out), "--op", "allreduce", "--link", "inter", "--procs", "8", "--bytes", "64M"]
    code, stdout, err = run_main(capsys, [*predict, "--json"])
    assert code == 0, err
    pred = json.loads(stdout)
    assert pred["extrapolated"] and pred["low_s"] < pred["seconds"] < pred["high_s"]
    assert pred["seconds"] == pytest.approx(14 * 20e-6 + 14 / 8 * 2 ** 26 * 1e-9, rel=0.03)
    proc = run_cli(predict)
    assert proc.returncode == 0 and "extrapolated" in proc.stdout and "ms" in proc.stdout
    code, md, _ = run_main(capsys, ["table", str(out)])
    assert code == 0 and "| allreduce | inter | 2,4 | ring |" in md and "GEMM" in md
    code, csv, _ = run_main(capsys, ["table", str(out), "--format", "csv"])
    assert code == 0 and csv.splitlines()[0].startswith("table,op,link,procs")
    assert len(csv.splitlines()) == 1 + 2 + 2    # header, two models, Hockney p=2 and p=4


def test_fit_reads_a_run_killed_before_consolidation(tmp_path, capsys):
    run = write_synthetic_run(tmp_path / "r", {("allreduce", "inter"): (20e-6, 1e-9)}, {"inter": [2]},
                              consolidate=False)
    assert run_main(capsys, ["fit", str(run), "--out", str(tmp_path / "c.json")])[0] == 0


def _expect_usage_error(capsys, args, fragment):
    code, out, err = run_main(capsys, args)
    assert code == 2, out + err
    assert fragment in err and err.count("\n") == 1


def test_unknown_options_and_bad_choices_are_one_line_with_the_prefix_once(tmp_path, capsys):
    code, _, err = run_main(capsys, ["table", str(tmp_path / "c.json"), "--bogus"])
    assert code == 2 and err == "commcal: error: unrecognized arguments: --bogus\n"
    code, _, err = run_main(capsys, ["fit", str(tmp_path), "--out", "c.json", "--method", "ols"])
    assert code == 2 and err.startswith("commcal: error: fit: argument --method: invalid choice: 'ols'")


def test_fit_rejects_a_run_without_samples(tmp_path, capsys):
    run = write_synthetic_run(tmp_path / "r", {("allreduce", "inter"): (20e-6, 1e-9)}, {"inter": [2]},
                              write_points=False)
    (run / "samples.parquet").unlink()
    _expect_usage_error(capsys, ["fit", str(run), "--out", str(tmp_path / "c.json")], "no samples")
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize("name", ["samples.parquet", "summary.parquet"])
def test_fit_rejects_corrupt_or_truncated_parquet(tmp_path, capsys, name):
    run = write_synthetic_run(tmp_path / "r", {("allreduce", "inter"): (20e-6, 1e-9)}, {"inter": [2]})
    data = (run / name).read_bytes()
    (run / name).write_bytes(data[: len(data) // 2])
    _expect_usage_error(capsys, ["fit", str(run), "--out", str(tmp_path / "c.json")], "corrupt or truncated")


def test_fit_and_predict_usage_errors(tmp_path, capsys, run_dir):
    _expect_usage_error(capsys, ["fit", str(tmp_path), "--out", str(tmp_path / "c.json")], "no run.json")
    _expect_usage_error(capsys, ["predict", str(tmp_path / "none.json"), "--op", "allreduce", "--link", "inter",
                         "--procs", "2", "--bytes", "1M"], "cannot read")
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(synthetic_calibration({("allreduce", "inter"): (1e-6, 1e-9)})))
    _expect_usage_error(capsys, ["predict", str(cal), "--op", "allreduce", "--link", "inter", "--procs", "2",
                         "--bytes", "lots"], "malformed size")
    _expect_usage_error(capsys, ["predict", str(cal), "--op", "alltoall", "--link", "inter", "--procs", "2",
                         "--bytes", "1M"], "no model for alltoall")


def test_fit_after_compute_runs_give_the_models_of_calls_that_follow_a_computation(tmp_path, capsys):
    """A plain sweep and one with a GEMM before each call, whose allreduce pays 80 us more latency there: fit keeps
    the two apart (after_compute, version 7), predict prices each context by its own model and falls back to the
    plain one where the after-compute sweep lacks the collective; mismatched sweeps are one line and exit 2."""
    cold = {"cache": "cold"}
    plain = write_synthetic_run(tmp_path / "plain", {("allreduce", "intra"): (4e-6, 3e-10),
                                                     ("allgather", "intra"): (3e-6, 3e-10)},
                                {"intra": [2, 4]}, seed=1, run_id="plain", options=cold)
    after = write_synthetic_run(tmp_path / "after", {("allreduce", "intra"): (84e-6, 3e-10)}, {"intra": [2, 4]},
                                seed=2, run_id="after", options=cold | {"after_gemm": 384})
    out = tmp_path / "cal.json"
    code, stdout, err = run_main(capsys, ["fit", str(plain), "--after-compute", str(after), "--out", str(out)])
    assert code == 0, err
    assert "after compute (384x384 GEMM before each call):" in stdout and "and 1 after-compute models" in stdout
    data = json.loads(out.read_text())
    assert data["version"] == VERSION == 20
    assert data["after_compute"]["after_gemm"] == 384 and data["after_compute"]["run_ids"] == ["after"]
    assert data["provenance"]["run_ids"] == ["plain", "after"]
    assert data["after_compute"]["models"]["allreduce"]["intra"]["alpha_s"] == pytest.approx(84e-6, rel=0.05)
    assert data["models"]["allreduce"]["intra"]["alpha_s"] == pytest.approx(4e-6, rel=0.05)
    cal = load_calibration(out)
    n = np.array([1e3, 1e6])
    gap = cal.predict_seconds("allreduce", "intra", 4, n, after_compute=True) - cal.predict_seconds(
        "allreduce", "intra", 4, n)
    np.testing.assert_allclose(gap, 6 * 80e-6, rtol=0.1)      # ring allreduce at p = 4: 2(p-1) latencies
    assert cal.predict_seconds("allgather", "intra", 4, n, True) == pytest.approx(
        cal.predict_seconds("allgather", "intra", 4, n))
    predict = ["predict", str(out), "--op", "allreduce", "--link", "intra", "--procs", "4", "--bytes", "1K", "--json"]
    code, stdout, err = run_main(capsys, [*predict, "--after-compute"])
    assert code == 0, err
    got = json.loads(stdout)
    assert "after-compute model" in got["note"] and got["seconds"] == pytest.approx(
        float(cal.predict_seconds("allreduce", "intra", 4, [1024], True)[0]))
    assert "after-compute" not in json.loads(run_main(capsys, predict)[1])["note"]
    assert "no after-compute model for allgather" in cal.predict("allgather", "intra", 4, 1024, True).note
    code, md, _ = run_main(capsys, ["table", str(out)])
    assert code == 0 and "## Collective models after a local computation (sweeps with a 384x384 GEMM" in md
    code, csv, _ = run_main(capsys, ["table", str(out), "--format", "csv"])
    tables = [line.split(",")[:3] for line in csv.splitlines()[1:]]
    assert ["after_compute", "allreduce", "intra"] in tables and ["model", "allgather", "intra"] in tables
    assert not any(t[0] == "after_compute" and t[1] == "allgather" for t in tables)
    fit = ["fit", str(plain), "--out", str(tmp_path / "c.json")]
    _expect_usage_error(capsys, [*fit, "--after-compute", str(plain)], "must come from sweeps with --after-gemm")
    warm = write_synthetic_run(tmp_path / "warm", {("allreduce", "intra"): (84e-6, 3e-10)}, {"intra": [2, 4]},
                               options={"cache": "warm", "after_gemm": 384})
    _expect_usage_error(capsys, [*fit, "--after-compute", str(warm)], "differ from the main runs in cache")
    _expect_usage_error(capsys, [*fit, "--after-compute", str(after), "--after-compute", str(warm)],
                        "runs mix cold and warm buffers")
    assert not (tmp_path / "c.json").exists()
    code, _, err = run_main(capsys, ["fit", str(plain), "--out", str(tmp_path / "c.json")])
    assert code == 0, err
    _expect_usage_error(capsys, ["predict", str(tmp_path / "c.json"), "--op", "allreduce", "--link", "intra",
                                 "--procs", "4", "--bytes", "1K", "--after-compute"], "has no after-compute models")
    bad = json.loads(out.read_text())
    bad["after_compute"]["gemm"] = 384
    with pytest.raises(UsageError, match="unknown key 'after_compute.gemm'"):
        calibration_from_dict(bad)


@pytest.mark.parametrize("runs,links,says", [
    ([{"preset": "quick", "launches": 2}], ("intra",), ["quick sweep"]),
    ([{"preset": "default", "launches": 1}], ("intra", "inter"), ["one MPI launch"]),
    ([{"preset": "quick", "launches": 1}], ("inter",), ["quick sweep", "one MPI launch"]),
    ([{"preset": "default", "launches": 1}], ("intra",), []),            # one node: no launch-dependent link
    ([{"preset": "default", "launches": 2}], ("intra", "inter"), []),
    ([{}], ("intra", "inter"), []),                                       # older files and imports: unknown
    ([{"preset": "default", "launches": 2, "after_gemm": 0}], ("intra", "inter"), ["no after-compute models"]),
    ([{"preset": "quick", "launches": 2, "after_gemm": 0}], ("intra",), ["quick sweep", "no after-compute models"]),
])
def test_validate_is_told_when_a_calibration_came_from_a_path_known_to_rank_worse(runs, links, says):
    data = synthetic_calibration({("allreduce", link): (5e-6, 1e-9) for link in links},
                                 links={link: [2, 4] for link in links})
    data["provenance"]["runs"] = [{"run_id": "r", "dir": "r", "date": "d", "machine": "m", "hosts": ["m"],
                                   "mpi_library": "x", "versions": {}, **r} for r in runs]
    advice = calibration_from_dict(data).path_advice()
    assert len(advice) == len(says) and all(s in line for s, line in zip(says, advice))


def test_validate_is_told_which_models_moved_between_launches():
    """A model whose points ran at other speeds in other launches: one advice line naming the most moved model."""
    data = synthetic_calibration({("allgather", "inter"): (5e-6, 1e-9), ("allreduce", "inter"): (5e-6, 1e-9)},
                                 links={"inter": [2, 4]})
    assert calibration_from_dict(data).path_advice() == ()
    data["models"]["allgather"]["inter"]["launch_spread"] = {"launches": 2, "n_points": 9, "median": 0.02,
                                                            "max": 0.235, "max_at_bytes": 4194304.0,
                                                            "max_at_procs": 2}
    data["models"]["allreduce"]["inter"]["launch_spread"] = {"launches": 2, "n_points": 9, "median": 0.01,
                                                            "max": 0.05, "max_at_bytes": 8.0, "max_at_procs": 2}
    advice = calibration_from_dict(data).path_advice()
    assert len(advice) == 1 and advice[0].startswith("1 model(s) moved between MPI launches by more than 10%")
    assert "allgather/inter, 24% at 4.1943e+06 B, 2 ranks" in advice[0], advice
    data["models"]["allreduce"]["inter"]["speeds"] = {"n_points": 2, "of_points": 10, "max_ratio": 1.96,
                                                     "max_at_bytes": 4194304.0, "max_at_procs": 2}
    advice = calibration_from_dict(data).path_advice()
    assert len(advice) == 2 and advice[1].startswith("1 model(s) priced some points at the fast one of several speeds")
    assert "allreduce/inter, the slower calls 1.96x the price at 4.1943e+06 B, 2 ranks" in advice[1], advice
    assert {k: [x.max_ratio for x in v] for k, v in calibration_from_dict(data).several_speeds().items()} \
        == {("allreduce", "inter"): [1.96]}


def test_several_speeds_takes_the_slowest_of_the_back_to_back_and_after_compute_models():
    """validate's steps of a collective are priced by either model, so the speeds either recorded bound them."""
    ab = {("allgather", "inter"): (5e-6, 1e-9), ("allreduce", "inter"): (5e-6, 1e-9)}
    data = synthetic_calibration(ab, links={"inter": [2, 4]}, after_compute=ab)

    def speeds(ratio: float) -> dict:
        return {"n_points": 1, "of_points": 9, "max_ratio": ratio, "max_at_bytes": 8.0, "max_at_procs": 2}

    data["models"]["allreduce"]["inter"]["speeds"] = speeds(1.3)
    data["after_compute"]["models"]["allreduce"]["inter"]["speeds"] = speeds(1.48)
    data["after_compute"]["models"]["allgather"]["inter"]["speeds"] = speeds(1.2)
    got = calibration_from_dict(data).several_speeds()
    assert {k: [x.max_ratio for x in v] for k, v in got.items()} == {("allreduce", "inter"): [1.3, 1.48],
                                                                     ("allgather", "inter"): [1.2]}
