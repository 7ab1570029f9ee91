"""commcal diff: a degraded link and a changed algorithm stand out; noise within the CIs does not."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from calib.calibration import model_sets
from calib.synthetic import synthetic_calibration
from reports.cli import main
from reports import diff

MODELS = {("allreduce", "intra"): (4e-6, 1e-10), ("allreduce", "inter"): (2e-5, 1e-9),
          ("pingpong", "inter"): (1e-5, 8e-10)}


def _with_cis(data: dict, rel: float = 0.1) -> dict:
    """Give every model, after-compute ones included, a +-rel 95% CI on alpha and beta (synthetic ones are exact)."""
    for by_link in (by for _, models in model_sets(data) for by in models.values()):
        for m in by_link.values():
            m["alpha_ci95_s"] = [m["alpha_s"] * (1 - rel), m["alpha_s"] * (1 + rel)]
            m["beta_ci95_s_per_byte"] = [m["beta_s_per_byte"] * (1 - rel), m["beta_s_per_byte"] * (1 + rel)]
    return data


@pytest.fixture()
def cals(tmp_path) -> tuple[Path, Path, Path]:
    """A; B = A with the inter-node allreduce at half bandwidth, pingpong on another algorithm, intra alpha +3%."""
    a = _with_cis(synthetic_calibration(MODELS, gemm={"float32": 5e10}))
    b = copy.deepcopy(a)
    inter = b["models"]["allreduce"]["inter"]
    inter["beta_s_per_byte"] *= 2
    inter["beta_ci95_s_per_byte"] = [x * 2 for x in inter["beta_ci95_s_per_byte"]]
    b["models"]["allreduce"]["intra"]["alpha_s"] *= 1.03
    b["models"]["pingpong"]["inter"]["algorithm"] = "linear"
    paths = []
    for name, data in (("a", a), ("b", b)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(data))
    return paths[0], paths[1], tmp_path


def _find(items, subject, parameter):
    return next(c for c in items if c.subject == subject and c.parameter == parameter)


def test_changes_flag_what_left_the_cis(cals):
    a, b, _ = cals
    items = diff.changes(json.loads(a.read_text()), json.loads(b.read_text()))
    bw = _find(items, "allreduce/inter", "bandwidth 1/beta (GB/s)")
    assert bw.relative == pytest.approx(-0.5) and bw.significant
    alpha = _find(items, "allreduce/intra", "alpha (µs)")
    assert alpha.relative == pytest.approx(0.03) and not alpha.significant
    assert _find(items, "pingpong/inter", "algorithm").significant
    assert not _find(items, "gemm/float32", "rate (GFLOP/s)").significant
    assert sorted(f"{c.subject} {c.parameter}" for c in items if c.significant) == [
        "allreduce/inter bandwidth 1/beta (GB/s)", "pingpong/inter algorithm"]


def test_diff_figure_has_one_bar_per_model_red_where_changed(cals):
    a, b, _ = cals
    fig = diff.figure(diff.changes(json.loads(a.read_text()), json.loads(b.read_text())))
    bw = next(ax for ax in fig.axes if ax.get_title() == "bandwidth 1/beta (GB/s)")
    assert bw.get_xlabel() == diff.CHANGE_LABEL
    labels = [t.get_text() for t in bw.get_yticklabels()]
    assert labels == ["allreduce/intra", "allreduce/inter", "pingpong/inter (p2p → linear)"]
    (bars,) = bw.containers
    assert np.allclose([p.get_width() for p in bars], [0, -50, 0])
    colors = [p.get_facecolor() for p in bars]
    assert colors[1] != colors[0] and colors[0] == colors[2]   # the degraded link is coloured apart


def test_diff_cli_prints_table_writes_files_and_checks(cals, capsys):
    a, b, out = cals
    assert main(["diff", str(a), str(b), "--out", str(out / "d")]) == 0
    text = capsys.readouterr().out
    assert "allreduce/inter" in text and "-50.0%" in text and "2 of" in text and "CHANGED" in text
    for name in ("diff.html", "diff.md", "figures/diff.png", "figures/diff.svg"):
        assert (out / "d" / name).stat().st_size > 0
    assert "What changed" in (out / "d" / "diff.html").read_text()
    assert main(["diff", str(a), str(b), "--check"]) == 1
    assert main(["diff", str(a), str(a), "--check"]) == 0
    assert "0 of" in capsys.readouterr().out


def test_models_in_one_calibration_only_are_named_as_such(cals):
    a, b, _ = cals
    data_b = json.loads(b.read_text())
    del data_b["models"]["pingpong"]
    items = diff.changes(json.loads(a.read_text()), data_b)
    rows = {(r[0], r[1]): r[-1] for r in diff.table(items).rows}
    assert rows[("pingpong/inter", "alpha (µs)")] == "only in A"
    assert rows[("allreduce/inter", "bandwidth 1/beta (GB/s)")] == "CHANGED"
    assert rows[("allreduce/intra", "alpha (µs)")] == ""


def test_diff_of_a_corrupt_calibration_is_a_usage_error(cals, capsys):
    a, _, out = cals
    bad = out / "bad.json"
    bad.write_text('{"schema": "commcal.calibration", "version": 1}')
    assert main(["diff", str(a), str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing key" in err[0]


def test_after_compute_models_are_compared_apart_from_the_main_ones():
    """A's after-compute allreduce/intra runs at half bandwidth in B; B alone has an after-compute allreduce/inter.
    The main models are equal, so only the after-compute rows change."""
    after = {("allreduce", "intra"): (8e-5, 1e-10)}
    a = _with_cis(synthetic_calibration(MODELS, after_compute=after))
    b = _with_cis(synthetic_calibration(MODELS, after_compute={**after, ("allreduce", "inter"): (9e-5, 1e-9)}))
    b["after_compute"]["models"]["allreduce"]["intra"]["beta_s_per_byte"] *= 2
    items = diff.changes(a, b)
    bw = _find(items, "allreduce/intra after compute", "bandwidth 1/beta (GB/s)")
    assert bw.relative == pytest.approx(-0.5) and bw.significant
    assert _verdict_of(items, "allreduce/inter after compute") == "only in B"
    assert not _find(items, "allreduce/intra", "bandwidth 1/beta (GB/s)").significant
    assert sorted({c.subject for c in items if c.significant}) == [
        "allreduce/inter after compute", "allreduce/intra after compute"]
    no_after = _with_cis(synthetic_calibration(MODELS))
    assert _verdict_of(diff.changes(a, no_after), "allreduce/intra after compute") == "only in A"


def _verdict_of(items, subject):
    return {(r[0], r[1]): r[-1] for r in diff.table(items).rows}[(subject, "alpha (µs)")]
