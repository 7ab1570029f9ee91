"""commcal report: built from small fixture runs; files, figure contents, HTML sections, missing and corrupt inputs."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from reports.cli import main
from microbench.errors import UsageError
from analysis import ranking
from calib.calibration import load_calibration
from calib.synthetic import Segment, TrueModel, synthetic_calibration, write_synthetic_run
from reports import calibration_view, report_cmd, validation_view
from reports.curves import BUSBW_LABEL, GFLOPS_LABEL, LATENCY_LABEL, RESIDUAL_LABEL, measured_figure
from reports.runs import load_runs

SIZES = tuple(2 ** k for k in range(3, 23, 2))
TRUTH = {("allreduce", "intra"): TrueModel((Segment(8192, 4e-6, 2e-10), Segment(math.inf, 1.5e-5, 1e-10))),
         ("allreduce", "inter"): (2e-5, 1e-9),
         ("pingpong", "intra"): (1e-6, 1e-10)}
LINKS = {"intra": [2, 4], "inter": [2, 4]}


def write_validation(path: Path, with_summary: bool = True, fmt: str = "parquet") -> Path:
    """A validation directory per reports/validation_view.py: two layers of three strategies each."""
    path.mkdir(parents=True)
    rows = [dict(layer=layer, strategy=s, predicted_s=p, measured_s=m, predicted_comm_s=p / 2, measured_comm_s=m / 3,
                 measured_ci_low_s=m * 0.97, measured_ci_high_s=m * 1.03)
            for layer, strategies in (("mlp.fc1", (("S(0)", 3e-3, 3.3e-3), ("S(1)", 2e-3, 2.6e-3), ("B", 5e-3, 4e-3))),
                                      ("attn.qkv", (("S(0)", 1e-3, 1.4e-3), ("P", 1.6e-3, 1.2e-3))))
            for s, p, m in strategies]
    frame = pd.DataFrame(rows)
    if fmt == "parquet":
        frame.to_parquet(path / "strategies.parquet")
    else:
        frame.drop(columns=["measured_ci_low_s", "measured_ci_high_s"]).to_csv(path / "strategies.csv", index=False)
    if with_summary:
        metric = lambda v, lo=None, hi=None: {"value": v, "ci95": None if lo is None else [lo, hi]}  # noqa: E731
        (path / "summary.json").write_text(json.dumps({
            "calibration": "cal.json", "mesh": "2x2", "layers_run": 2,
            "metrics": {"kendall_tau": metric(0.6, 0.2, 0.9), "top1": metric(0.5, 0.0, 1.0),
                        "regret": metric(0.08, 0.0, 0.17), "mean_accuracy": metric(0.75),
                        "spearman_rho": metric(0.7, 0.3, 0.95), "comm_kendall_tau": metric(None),
                        "comm_top1": metric(1.0, 1.0, 1.0)},
            "layers": {"mlp.fc1": {"kendall_tau": metric(0.33, -0.5, 1.0), "top1": metric(0.0)},
                       "attn.qkv": {"kendall_tau": metric(-1.0), "top1": metric(0.0)}},
            "by_link": {"inter": {"strategies": 3, "comm_mean_accuracy": metric(0.97, 0.95, 0.98)},
                        "intra": {"strategies": 2, "comm_mean_accuracy": metric(0.84, 0.79, 0.87)}},
            "step_ratios": [{"op": "allgather", "link": "inter", "steps": 5, "median": 1.07, "quartiles": [1.05, 1.08],
                             "slow_steps": 1, "sweep_slow_ratio": 1.9, "verdict": "slower"},
                            {"op": "alltoall", "link": "intra", "steps": 8, "median": 2.03, "quartiles": [1.6, 2.9]}],
            "notes": ["comm_*: communication time only"]}))
        (path / "run.json").write_text(json.dumps({"command": "validate", "machine": "testbox",
                                                   "mpi_library_version": "Open MPI v5.0.9"}))
    return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """A synthetic run, a calibration of the same truth (with held-out errors filled in), a validation dir."""
    root = tmp_path_factory.mktemp("inputs")
    run = write_synthetic_run(root / "r1", TRUTH, LINKS, sizes=SIZES, samples=9, gemm={"float32": 5e10})
    data = synthetic_calibration(TRUTH, LINKS, gemm={"float32": 5e10}, sizes=SIZES)
    for i, by_link in enumerate(data["models"].values()):
        for j, m in enumerate(by_link.values()):
            m["heldout"].update(median_abs_rel_err=0.02 * (i + j + 1), p90_abs_rel_err=0.05 * (i + j + 1))
    cal = root / "cal.json"
    cal.write_text(json.dumps(data))
    return {"run": run, "cal": cal, "validation": write_validation(root / "val")}


@pytest.fixture(scope="module")
def full_report(inputs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "rep"
    assert main(["report", "--run", str(inputs["run"]), "--calibration", str(inputs["cal"]),
                 "--validation", str(inputs["validation"]), "--out", str(out)]) == 0
    return out


def _legend(fig) -> list[str]:
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


def _by_label(fig, label: str):
    return next(ax for ax in fig.axes if ax.get_ylabel() == label)


def test_measured_figure_has_labelled_log_axes_and_one_series_per_procs(inputs):
    runs = load_runs([inputs["run"]])
    fig = measured_figure(runs, "allreduce", "intra")
    lat, bw = fig.axes
    assert lat.get_ylabel() == LATENCY_LABEL and bw.get_ylabel() == BUSBW_LABEL
    assert "size" in lat.get_xlabel() and lat.get_xscale() == "log" and lat.get_yscale() == "log"
    assert _legend(fig) == ["p=2", "p=4"]
    # the plotted points are the run's: busbw = size * 2(p-1)/p / median, in GB/s
    rows = runs.summary.query("op == 'allreduce' and link == 'intra' and procs == 4")
    ys = [line.get_ydata() for line in bw.get_lines() if len(line.get_xdata()) == len(rows)]
    assert any(np.allclose(y, rows["busbw_Bps"].to_numpy() / 1e9) for y in ys)


def test_measured_figure_overlays_the_calibration_and_its_residuals(inputs):
    runs, cal = load_runs([inputs["run"]]), load_calibration(inputs["cal"])
    fig = measured_figure(runs, "allreduce", "intra", cal)
    lat, res = _by_label(fig, LATENCY_LABEL), _by_label(fig, RESIDUAL_LABEL)
    assert _legend(fig) == ["p=2", "p=4", "fitted model (band: 95% PI)", "model, extrapolated"]
    assert [t.get_text() for t in lat.texts] == ["seg 1", "seg 2"]   # two fitted segments, both shaded
    model = [line for line in lat.get_lines() if line.get_label() == "_model"]
    assert len(model) == 2   # one model line per process count
    x, y = model[1].get_xdata(), model[1].get_ydata()
    inside = np.isfinite(y)
    assert np.allclose(y[inside], cal.predict_seconds("allreduce", "intra", 4, x[inside]) * 1e6)
    # the synthetic run is the calibration's truth plus 1% noise: residuals are small but not all zero
    resid = np.concatenate([line.get_ydata() for line in res.get_lines() if len(line.get_xdata()) == len(SIZES)])
    assert 0.01 < np.abs(resid).max() < 10


def test_gemm_figure_shows_compute_rate_and_the_calibrated_rate(inputs):
    runs, cal = load_runs([inputs["run"]]), load_calibration(inputs["cal"])
    fig = measured_figure(runs, "gemm", "intra", cal)
    rate = _by_label(fig, GFLOPS_LABEL)
    assert sorted(_legend(fig)) == ["calibrated rate, float32", "p=1"]
    (line,) = [ln for ln in rate.get_lines() if ln.get_label() == "calibrated rate, float32"]
    assert np.allclose(line.get_ydata(), 50.0)   # 5e10 FLOP/s in GFLOP/s
    big = runs.summary.query("op == 'gemm'").sort_values("size_bytes").iloc[-1]
    measured = [ln.get_ydata() for ln in rate.get_lines() if len(ln.get_xdata()) == len(SIZES)]
    assert np.isclose(measured[0][-1], big["flops_per_s"] / 1e9)


def test_calibration_figures_show_every_model(inputs):
    data = load_calibration(inputs["cal"]).data
    heat = calibration_view.alpha_beta_heatmap(data)
    alpha = heat.axes[0]
    assert [t.get_text() for t in alpha.get_yticklabels()] == ["allreduce", "pingpong"]
    assert [t.get_text() for t in alpha.get_xticklabels()] == ["intra", "inter"]
    assert [t.get_text() for t in alpha.texts] == ["4", "20", "1", "–"]   # µs, row by row; no pingpong inter model
    held = calibration_view.heldout_figure(data)
    (ax,) = held.axes
    assert ax.get_ylabel() == calibration_view.HELDOUT_LABEL
    heights = [p.get_height() for p in ax.patches]
    assert np.allclose(sorted(h for h in heights if np.isfinite(h)), [2, 4, 4])   # medians in %, from the file


def test_calibration_table_and_figures_show_the_after_compute_models_after_the_main_ones():
    data = synthetic_calibration({("allreduce", "intra"): (4e-6, 1e-10), ("allreduce", "inter"): (2e-5, 1e-9)},
                                 after_compute={("allreduce", "intra"): (8e-5, 2e-10)})
    rows = calibration_view.alpha_beta_table(data).rows
    assert [r[:3] for r in rows] == [("allreduce", "intra", "back to back"), ("allreduce", "inter", "back to back"),
                                     ("allreduce", "intra", "after a 384² GEMM")]
    assert [r[4] for r in rows] == ["4", "20", "80"] and rows[2][6] == "5"   # alpha in µs; 1/beta in GB/s
    heat = calibration_view.alpha_beta_heatmap(data).axes[0]
    assert [t.get_text() for t in heat.get_xticklabels()] == ["intra", "inter", "intra\nafter\ncompute"]
    assert [t.get_text() for t in heat.texts] == ["4", "20", "80"]
    (held,) = calibration_view.heldout_figure(data).axes
    assert "intra after compute: median" in _legend_of(held)
    del data["after_compute"]
    assert len(calibration_view.alpha_beta_table(data).rows) == 2
    assert len(calibration_view.alpha_beta_heatmap(data).axes[0].get_xticklabels()) == 2


def test_layers_table_names_both_bests_the_regret_and_the_refined_contenders():
    frame = pd.DataFrame({"layer": ["a", "a", "a", "b"], "strategy": ["x", "y", "z", "w"],
                          "predicted_s": [1e-3, 2e-3, 3e-3, 1e-3], "measured_s": [2.2e-3, 2e-3, 5e-3, 1e-3],
                          "refined": [True, True, False, False]})
    rows = validation_view.layers_table(frame).rows
    assert rows == (("a", "3", "y", "2", "x", "2.2", "10.0%", "2"), ("b", "1", "w", "1", "w", "1", "0.0%", "0"))
    assert len(validation_view.layers_table(frame.drop(columns="refined")).rows[0]) == 7


def test_layers_table_picks_the_slowest_of_tied_predicted_bests_as_the_regret_metric_does():
    frame = pd.DataFrame({"layer": ["a", "a", "a"], "strategy": ["x", "y", "z"],
                          "predicted_s": [1e-3, 1e-3, 3e-3], "measured_s": [2e-3, 2.5e-3, 4e-3]})
    (row,) = validation_view.layers_table(frame).rows
    assert row == ("a", "3", "x", "2", "y (tied with 1 more)", "2.5", "25.0%")
    assert ranking.layer_metrics(frame["predicted_s"], frame["measured_s"])["regret"] == pytest.approx(0.25)


def test_validation_figures_pair_bars_sorted_by_measured_time(inputs):
    val = validation_view.load_validation(inputs["validation"])
    bars = validation_view.paired_bars_figure(val.strategies)
    fc1 = next(ax for ax in bars.axes if ax.get_title() == "layer mlp.fc1")
    assert [t.get_text() for t in fc1.get_xticklabels()] == ["S(1)", "S(0)", "B"]
    assert fc1.get_ylabel() == validation_view.TIME_LABEL
    measured = [c for c in fc1.containers if c.get_label() == "measured"][0]
    assert np.allclose([p.get_height() for p in measured], [2.6, 3.3, 4.0])
    assert {"measured", "predicted", "measured: communication"} <= set(_legend_of(fc1))
    scatter = validation_view.scatter_figure(val.strategies)
    (ax,) = scatter.axes
    assert "measured" in ax.get_xlabel() and "predicted" in ax.get_ylabel()
    assert {"layer mlp.fc1", "layer attn.qkv", "y = x"} == set(_legend_of(ax))
    ranking = validation_view.ranking_figure(val.metrics)
    titles = [ax.get_title() for ax in ranking.axes if ax.get_visible()]
    assert [t.split("\n")[0] for t in titles] == ["Kendall's tau", "top-1 accuracy", "regret of predicted best",
                                                  "mean accuracy", "top-1 accuracy"]
    assert titles[0].endswith("(end to end)") and titles[4].endswith("(communication only)")
    assert [ax.get_visible() for ax in ranking.axes] == [True] * 4 + [False, True, False, False]   # comm tau is null
    tau = ranking.axes[0]
    assert tau.get_ylim()[0] < -1 and tau.get_ylim()[1] > 1 and tau.get_ylabel() == "value (95% CI)"


def test_step_ratio_figure_draws_medians_and_quartiles_from_the_summary(inputs):
    val = validation_view.load_validation(inputs["validation"])
    assert [(a.link, a.strategies, a.accuracy.value) for a in val.by_link] == [("inter", 3, 0.97), ("intra", 2, 0.84)]
    (ax,) = validation_view.step_ratio_figure(val.step_ratios).axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["allgather/inter", "alltoall/intra"]
    dots = [line.get_ydata()[0] for line in ax.lines if line.get_marker() == "o"]
    assert np.allclose(dots, [1.07, 2.03])
    bars = [seg for c in ax.collections for seg in c.get_segments()]
    assert np.allclose(sorted((s[0][1], s[1][1]) for s in bars), [(1.05, 1.08), (1.6, 2.9)])
    assert any(np.allclose(line.get_ydata(), 1.0) for line in ax.lines if line.get_linestyle() == "--")


def _legend_of(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_full_report_writes_every_file_and_names_every_section(full_report):
    out = full_report
    figures = ["measured-allreduce-intra", "measured-allreduce-inter", "measured-pingpong-intra",
               "measured-gemm-intra", "alpha-beta-heatmap", "heldout-error", "ranking-accuracy",
               "step-ratios", "validation-bars", "validation-scatter"]
    for name in ["report.html", "report.md", *(f"figures/{f}.{ext}" for f in figures for ext in ("png", "svg"))]:
        assert (out / name).stat().st_size > 0, name
    html, md = (out / "report.html").read_text(), (out / "report.md").read_text()
    for title in ("Provenance", "Measurements", "Calibration", "Validation"):
        assert f"<h2>{title}</h2>" in html and f"## {title}" in md
    assert html.count("data:image/png;base64,") == len(figures)
    assert all(f"figures/{f}.png" in md for f in figures)
    assert "Runs at a glance" in html and "synthetic MPI 0.0" in html   # provenance of the run
    assert "synthetic calibration, not fitted" in html          # the fit's warnings
    assert "Kendall&#x27;s tau" in html and "mlp.fc1" in html    # the validation summary
    assert "Ranking accuracy per layer" in html and "Open MPI v5.0.9" in html and "communication time only" in html
    assert "<td>intra</td><td>2</td><td>0.84</td><td>0.79 – 0.87</td>" in html       # by_link
    assert "<td>alltoall</td><td>intra</td><td>8</td><td>2.030</td><td>1.600 – 2.900</td><td>-</td>" in html  # step_ratios
    assert ("<td>allgather</td><td>inter</td><td>5</td><td>1.070</td><td>1.050 – 1.080</td><td>1</td><td>slower</td>"
            in html)
    assert "<td>1.600 – 2.900</td><td>-</td><td>-</td>" in html      # an older summary's row: no verdict
    assert "slow-speed steps" in html and "verdict (priced" in html
    assert "No calibration given" not in html and "No validation given" not in html


def test_missing_inputs_leave_a_note_not_a_crash(tmp_path):
    run = write_synthetic_run(tmp_path / "small", {("pingpong", "intra"): (1e-6, 1e-10)}, {"intra": [2]},
                              sizes=(8, 1024, 65536), samples=5)
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, "mpi_library_version": "Open MPI v5.0.9, ident: 5.0.9\x00"}))
    out = tmp_path / "rep"
    assert main(["report", "--run", str(run), "--out", str(out)]) == 0
    html = (out / "report.html").read_text()
    assert "\x00" not in html and "\x00" not in (out / "report.md").read_text()   # MPI banners end in NUL
    assert "<td>Open MPI v5.0.9</td>" in html    # the at-a-glance table keeps the banner's first clause
    assert "No calibration given" in html and "No validation given" in html and "Residuals" not in html
    assert sorted(p.name for p in (out / "figures").iterdir()) == ["measured-pingpong-intra.png",
                                                                   "measured-pingpong-intra.svg"]
    only_val = tmp_path / "val-only"
    assert main(["report", "--validation", str(write_validation(tmp_path / "v", with_summary=False, fmt="csv")),
                 "--out", str(only_val)]) == 0
    html = (only_val / "report.html").read_text()
    assert "No sweep run given" in html and "no ranking metrics" in html
    assert "measured_ci_low_s" in html   # the optional columns it lacks are named


def test_nothing_to_report_and_corrupt_inputs_are_one_line_usage_errors(inputs, tmp_path, capsys):
    bad_run = tmp_path / "bad"
    shutil.copytree(inputs["run"], bad_run)
    (bad_run / "summary.parquet").write_bytes(b"PAR1 not really")
    bad_cal = tmp_path / "cal.json"
    bad_cal.write_text(inputs["cal"].read_text()[:-20])
    bad_val = write_validation(tmp_path / "val")
    (bad_val / "summary.json").write_text('{"metrics": {"top1": {"value": "high"}}}')
    bad_ratios = write_validation(tmp_path / "val2")
    (bad_ratios / "summary.json").write_text('{"metrics": {}, "step_ratios": [{"op": "allgather", "link": "intra", '
                                             '"steps": 3, "median": 1.2, "quartiles": [1.1]}]}')
    bad_slow = write_validation(tmp_path / "val3")
    (bad_slow / "summary.json").write_text('{"metrics": {}, "step_ratios": [{"op": "allgather", "link": "intra", '
                                           '"steps": 3, "median": 1.2, "quartiles": [1.1, 1.3], "slow_steps": "x"}]}')
    bad_verdict = write_validation(tmp_path / "val4")
    (bad_verdict / "summary.json").write_text('{"metrics": {}, "step_ratios": [{"op": "allgather", "link": "intra", '
                                              '"steps": 3, "median": 1.2, "quartiles": [1.1, 1.3], "verdict": 7}]}')
    cases = [[], ["--run", str(bad_run)], ["--calibration", str(bad_cal)], ["--validation", str(bad_val)],
             ["--validation", str(tmp_path)], ["--validation", str(bad_ratios)], ["--validation", str(bad_slow)],
             ["--validation", str(bad_verdict)]]
    for args in cases:
        assert main(["report", *args, "--out", str(tmp_path / "out")]) == 2, args
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == len(cases) and "Traceback" not in "".join(err)
    assert "nothing to report" in err[0] and "corrupt" in err[1] and "not valid JSON" in err[2]
    assert "metrics.top1.value" in err[3] and "not a validation directory" in err[4]
    assert "step_ratios[0].quartiles must be [q1, q3]" in err[5]
    assert "step_ratios[0].slow_steps must be a count" in err[6]
    assert "step_ratios[0].verdict must be a string" in err[7]
    assert not (tmp_path / "out" / "report.html").exists()


def test_run_missing_columns_is_a_usage_error(inputs, tmp_path):
    bad = tmp_path / "thin"
    shutil.copytree(inputs["run"], bad)
    pd.read_parquet(bad / "summary.parquet").drop(columns=["median_s"]).to_parquet(bad / "summary.parquet")
    with pytest.raises(UsageError, match="median_s"):
        report_cmd.build([str(bad)], None, None, tmp_path / "out")


def test_validation_table_allows_unknown_intervals_but_not_missing_times(tmp_path):
    val = write_validation(tmp_path / "v")
    frame = pd.read_parquet(val / "strategies.parquet")
    frame.loc[0, ["measured_ci_low_s", "measured_ci_high_s"]] = np.nan   # too few samples for a CI
    frame.to_parquet(val / "strategies.parquet")
    assert validation_view.load_validation(val).strategies["measured_ci_low_s"].isna().sum() == 1
    for col, value in (("measured_s", np.nan), ("measured_ci_high_s", np.inf)):
        broken = frame.copy()
        broken.loc[1, col] = value
        broken.to_parquet(val / "strategies.parquet")
        with pytest.raises(UsageError, match=col):
            validation_view.load_validation(val)


def test_an_interval_that_does_not_hold_its_value_draws_no_whisker(tmp_path):
    frame = validation_view.load_validation(write_validation(tmp_path / "v")).strategies
    frame.loc[0, "measured_ci_low_s"] = 2 * frame.loc[0, "measured_s"]     # a hand-edited table can say anything
    fc1 = next(ax for ax in validation_view.paired_bars_figure(frame).axes if ax.get_title() == "layer mlp.fc1")
    measured = next(c for c in fc1.containers if c.get_label() == "measured")
    assert len(measured.errorbar.lines[2][0].get_segments()) == 3   # every bar keeps its whisker's drawable side


def test_ranks_that_outnumbered_the_cpus_are_said_in_the_page(tmp_path):
    """A sweep run or a validation that recorded more ranks than a machine's CPUs (cpu_sharing) gets one warning in
    the page naming both counts; values no writer of commcal's produces are left unsaid, not a crash."""
    run = write_synthetic_run(tmp_path / "run", {("pingpong", "intra"): (1e-6, 1e-10)}, {"intra": [2]},
                              sizes=(8, 1024, 65536), samples=5)
    val = write_validation(tmp_path / "val")
    meta, summary = json.loads((run / "run.json").read_text()), json.loads((val / "summary.json").read_text())

    def page(value) -> str:
        (run / "run.json").write_text(json.dumps(meta | {"cpu_sharing": value}))
        (val / "summary.json").write_text(json.dumps(summary | {"cpu_sharing": value}))
        out = tmp_path / "rep"
        shutil.rmtree(out, ignore_errors=True)
        assert main(["report", "--run", str(run), "--validation", str(val), "--out", str(out)]) == 0
        return (out / "report.md").read_text()

    text = page({"ranks": 4, "cpus": 2})
    assert text.count("4 ranks share 2 CPU(s) of one machine") == 2 and f"{run}: 4 ranks share" in text, text
    for value in (None, {"ranks": 2, "cpus": 2}, {"ranks": "4", "cpus": 2}, {"ranks": 2 ** 70, "cpus": 1}, [4, 2]):
        assert "ranks share" not in page(value), value
