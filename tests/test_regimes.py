"""calib.regimes: intervals of the size grid where the time grows faster than the size (beyond the CIs), which no
alpha-beta line allows; fit's warning about them; benchmarks.between's table of them. On synthetic sweeps of known
truth and on the real OSU fixture imported as commcal import reads it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calib.calibration import load_calibration
from calib.points import load_runs
from calib.regimes import change_warnings
from calib.synthetic import Segment, TrueModel, write_synthetic_run
from conftest import run_main
from microbench.records import load_summary
from microbench.regimes import HiddenChange, hidden_changes, middles

OSU = Path(__file__).parent / "data" / "peers" / "osu-7.5"
GRID = tuple(2 ** k for k in range(3, 21))                 # 8 B .. 1 MiB, powers of two
STEP = TrueModel((Segment(3000, 1.0e-6, 1e-10), Segment(math.inf, 2.5e-6, 1e-10)))
"""A protocol change at 3000 B, inside the 2-4 KiB octave, shaped like issue 31's shared-memory one (1.2 us at
2 KiB, 2.9 us at 4 KiB)."""
LINES = {("pingpong", "intra"): TrueModel.line(1.0e-6, 1e-10), ("allreduce", "intra"): TrueModel.line(3e-6, 2e-10),
         ("allgather", "intra"): TrueModel.line(2e-6, 4e-10)}


def _points(tmp_path: Path, models: dict, seed: int = 1, noise: float = 0.03) -> pd.DataFrame:
    run = write_synthetic_run(tmp_path / f"run{seed}", models, {"intra": [2, 4]}, sizes=GRID, noise=noise, seed=seed)
    return load_runs([str(run)]).points


def test_a_jump_inside_an_octave_is_flagged_and_named(tmp_path):
    """The step at 3000 B is found between 2048 and 4096 B at every process count, and nowhere else; the suggested
    sizes are the geometric middle in whole float32 elements and one element under the power of two that ends it."""
    changes = hidden_changes(_points(tmp_path, {("pingpong", "intra"): STEP, ("allreduce", "intra"): STEP}))
    assert {(c.op, c.procs) for c in changes} == {("pingpong", 2), ("allreduce", 2), ("allreduce", 4)}
    for c in changes:
        assert (c.low_bytes, c.high_bytes, c.size_ratio, c.suggest) == (2048, 4096, 2.0, (2896, 4092))
        assert c.time_ratio == pytest.approx(2.9 / 1.2, rel=0.1)


@pytest.mark.parametrize("seed", range(4))
def test_a_pure_hockney_line_with_noise_is_never_flagged(tmp_path, seed):
    """Noise inside the CIs (3% lognormal, 15 samples a point) never makes the time outgrow the size."""
    assert hidden_changes(_points(tmp_path, LINES, seed=seed, noise=0.03)) == []


def test_points_without_a_valid_ci_are_skipped():
    """A jump between points whose CI is missing (too few samples) or not an interval around the median is no
    evidence; the same jump with CIs is."""
    sizes = [1024, 2048, 4096, 8192]
    seconds = [1.0e-6, 1.1e-6, 3.0e-6, 3.4e-6]
    base = pd.DataFrame({"op": "pingpong", "link": "intra", "procs": 2, "size_bytes": sizes, "dtype": "float32",
                         "seconds": seconds})
    with_ci = base.assign(ci_low_s=base.seconds * 0.98, ci_high_s=base.seconds * 1.02)
    assert [(c.low_bytes, c.high_bytes) for c in hidden_changes(with_ci)] == [(2048, 4096)]
    assert hidden_changes(base.assign(ci_low_s=np.nan, ci_high_s=np.nan)) == []
    assert hidden_changes(with_ci.assign(ci_low_s=base.seconds * 1.1)) == []      # low above the median: invalid


def test_the_sweep_bisects_at_the_middle_of_each_flagged_interval_and_never_looks_at_held_out_points():
    """microbench.regimes.middles, the sweep's --bisect: a jump between 2 and 4 KiB seen on the grid gives its middle;
    a held-out point at 3 KiB, measured beside the grid and slow like 4 KiB, neither hides the jump nor moves it."""
    summary = pd.DataFrame({"op": "allreduce", "link": "intra", "procs": 2, "dtype": "float32",
                            "requested_bytes": [1024, 2048, 3072, 4096, 8192],
                            "size_bytes": [1024, 2048, 3072, 4096, 8192],
                            "median_s": [1.0e-6, 1.1e-6, 3.0e-6, 3.1e-6, 3.6e-6]})
    summary = summary.assign(ci_low_s=summary.median_s * 0.98, ci_high_s=summary.median_s * 1.02)
    assert middles(summary, frozenset({3072})) == {("allreduce", "intra", 2): [2896, 4092]}
    assert middles(summary) == {("allreduce", "intra", 2): [2508]}             # the 2-3 KiB interval, where it lies
    assert middles(summary[summary.requested_bytes != 4096], frozenset({3072})) == {}   # 2 to 8 KiB: x2.2 for x4


def test_a_rise_beyond_the_cis_but_within_5_percent_of_the_size_is_not_a_change():
    """A rate-limited link's curvature: medians 3% faster than the size with tight CIs are not flagged (nor bisected);
    10% faster are."""
    def rise(excess):
        t = np.array([1e-4, 2e-4 * (1 + excess)])
        return pd.DataFrame({"op": "pingpong", "link": "inter", "procs": 2, "size_bytes": [65536, 131072],
                             "requested_bytes": [65536, 131072], "dtype": "float32", "median_s": t,
                             "ci_low_s": t * 0.999, "ci_high_s": t * 1.001})
    points = lambda excess: rise(excess).rename(columns={"median_s": "seconds"})      # noqa: E731  (the fit's names)
    assert hidden_changes(points(0.03)) == [] and middles(rise(0.03)) == {}
    assert [(c.low_bytes, c.high_bytes) for c in hidden_changes(points(0.10))] == [(65536, 131072)]
    assert middles(rise(0.10)) == {("pingpong", "inter", 2): [92680, 131068]}


@pytest.mark.parametrize("step", [280_000, 300_000, 340_000, 450_000, 500_000])
def test_bisecting_twice_leaves_at_most_an_eighth_of_the_octave_priced_off_its_regime(tmp_path, step, capsys):
    """The sweep's two bisection passes (middles over the summaries so far, measured, then again) ahead of the fit:
    of the sizes inside an octave that holds a protocol change the grid cannot see, those the fit prices more than
    5% off their truth span at most an eighth of the octave (each pass halves the interval the change can lie in,
    and the fit's break falls mid-interval), and never more than without the bisection."""
    truth = {("allreduce", "inter"): TrueModel((Segment(step, 8e-6, 2e-10), Segment(math.inf, 90e-6, 3e-10)))}
    inside = np.geomspace(262144, 524288, 63)[1:-1]

    def off(sizes: list[int]) -> tuple[float, Path]:
        run = write_synthetic_run(tmp_path / f"run{len(sizes)}", truth, {"inter": [2, 4]}, sizes=sizes, seed=3)
        code, _, err = run_main(capsys, ["fit", str(run), "--out", str(tmp_path / f"cal{len(sizes)}.json")])
        assert code == 0, err
        cal = load_calibration(tmp_path / f"cal{len(sizes)}.json")
        err = [abs(cal.predict("allreduce", "inter", p, int(n)).seconds
                   / float(truth[("allreduce", "inter")].seconds("allreduce", p, int(n))) - 1)
               for p in (2, 4) for n in inside]
        return float(np.mean(np.array(err) > 0.05)), run

    grid = [2 ** k for k in range(10, 23)]
    before, run = off(grid)
    sizes = list(grid)
    for _ in range(2):
        sizes = sorted(set(sizes) | {n for found in middles(load_summary(run)).values() for n in found})
        after, run = off(sizes)
    assert len(sizes) == len(grid) + 3, sizes          # pass 1: the middle and one element under 512 KiB
    assert after <= min(before, 1 / 8) + 1 / len(inside), (before, after, sizes)


@pytest.mark.parametrize("power", [4096, 262144])
def test_a_change_right_at_a_power_of_two_is_located_and_the_size_under_it_priced_on_its_own_side(tmp_path, power,
                                                                                                  capsys):
    """A protocol switch at exactly a power of two (slower from it on, as issue 31's reduce-scatter at 256 KiB): the
    first pass measures one step under it beside the middle, which locates the change there, so the fit prices
    that size on the fast side (a middle alone never reaches it: 58% off before), and the fit no longer warns."""
    truth = {("reduce_scatter", "intra"): TrueModel((Segment(power, 4e-6, 2e-10), Segment(math.inf, 40e-6, 6e-10)))}
    grid = [2 ** k for k in range(10, 21)]
    sizes = list(grid)
    for k in range(3):
        run = write_synthetic_run(tmp_path / f"run{k}", truth, {"intra": [2]}, sizes=sizes, noise=0.02, seed=5)
        sizes = sorted(set(sizes) | {n for found in middles(load_summary(run)).values() for n in found})
    assert power - 8 in sizes, sizes                    # one step: a float32 block for each of 2 ranks
    code, _, err = run_main(capsys, ["fit", str(run), "--out", str(tmp_path / "cal.json")])
    assert code == 0 and "time grows faster than size" not in err, err
    cal = load_calibration(tmp_path / "cal.json")
    for n in (power - 8, power):
        want = float(truth[("reduce_scatter", "intra")].seconds("reduce_scatter", 2, n))
        assert cal.predict("reduce_scatter", "intra", 2, n).seconds == pytest.approx(want, rel=0.05), n


def test_between_leaves_out_held_out_points_next_to_a_bisected_size():
    """benchmarks.between: a held-out size within 1% of a size the sweep bisected at (same op, link, procs) is no
    longer held out; one farther, or of another operation, is."""
    from benchmarks.between import unseen

    index = ["op", "link", "procs", "requested_bytes"]
    held = pd.DataFrame({"op": ["allreduce", "allreduce", "bcast"], "link": "intra", "procs": 2,
                         "requested_bytes": [2896, 4088, 2896], "size_bytes": [2896, 4088, 2896],
                         "median_s": 1e-6}).set_index(index)
    bisected = pd.DataFrame({"op": ["allreduce"], "link": "intra", "procs": 2, "requested_bytes": [2900],
                             "size_bytes": [2900], "median_s": 1e-6}).set_index(index)
    kept = unseen(held, bisected)
    assert sorted(kept.index) == [("allreduce", "intra", 2, 4088), ("bcast", "intra", 2, 2896)]


def test_the_real_osu_latency_log_flags_its_protocol_change_once_it_has_cis(capsys, tmp_path):
    """The OSU 7.5 ping-pong fixture (0.41 us at 2 KiB, 1.90 us at 4 KiB) imported has no CIs (one mean a size), so
    nothing is claimed; given the sweep's default +-2% CI target its jumps beyond the size's ratio are named."""
    run = tmp_path / "osu"
    code, _, err = run_main(capsys, ["import", str(OSU / "osu_latency.txt"), "--link", "intra", "--out", str(run)])
    assert code == 0, err
    pts = load_runs([str(run)]).points
    assert hidden_changes(pts) == []
    flagged = hidden_changes(pts.assign(ci_low_s=pts.seconds * 0.98, ci_high_s=pts.seconds * 1.02))
    assert [(c.low_bytes, c.high_bytes) for c in flagged] == [(2048, 4096), (262144, 524288), (1048576, 2097152)]
    assert flagged[0].time_ratio == pytest.approx(1.90 / 0.41)


def test_fit_warns_once_per_op_and_link_with_the_sizes_to_add(capsys, tmp_path):
    """commcal fit prints one WARNING line on stderr per (op, link) with a flagged interval, naming it and the size
    to add with --resume, and records it in the calibration's warnings; a run of pure lines gets none."""
    run = write_synthetic_run(tmp_path / "step", {("pingpong", "intra"): STEP, ("allreduce", "intra"): STEP,
                                                   ("bcast", "intra"): TrueModel.line(3e-6, 2e-10)},
                              {"intra": [2, 4]}, sizes=GRID, noise=0.03, seed=2)
    cal = tmp_path / "cal.json"
    code, out, err = run_main(capsys, ["fit", str(run), "--out", str(cal)])
    assert code == 0, err
    lines = [w for w in err.splitlines() if "time grows faster than size" in w]
    assert [w.split(":")[1].strip() for w in lines] == ["allreduce/intra", "pingpong/intra"]
    assert all(w.startswith("WARNING: ") and "2048..4096 B" in w and "add 2896,4092 to the sweep's --sizes" in w
               and "--resume" in w for w in lines)
    assert "2048..4096 B at 2,4 ranks" in lines[0]
    assert [w for w in json.loads(cal.read_text())["warnings"] if "time grows faster" in w] == \
        [w.removeprefix("WARNING: ") for w in lines]
    flat = write_synthetic_run(tmp_path / "flat", LINES, {"intra": [2, 4]}, sizes=GRID, noise=0.03, seed=2)
    code, _, err = run_main(capsys, ["fit", str(flat), "--out", str(tmp_path / "flat.json")])
    assert code == 0 and "time grows faster" not in err


def test_warnings_group_intervals_by_op_and_link():
    """Many intervals of one (op, link) make one line, each interval once with its process counts."""
    changes = [HiddenChange("alltoall", "inter", p, lo, 2 * lo, 2.5, 2.0, (int(lo * 1.414),)) for lo in (2048, 65536)
               for p in (2, 4, 8)]
    located = HiddenChange("alltoall", "inter", 2, 262140, 262144, 3.0, 1.0, ())
    (line,) = change_warnings(changes + [located])
    assert line.count("2048..4096 B at 2,4,8 ranks") == 1 and line.count("65536..131072 B at 2,4,8 ranks") == 1
    assert "add 2895,92667 to the sweep's --sizes" in line and "262140" not in line
    assert change_warnings([located]) == []             # no whole element inside: located, nothing extrapolated


def test_between_benchmark_sets_the_error_inside_flagged_intervals_beside_the_rest():
    """benchmarks.between.flagged: per operation the median error of calibration A against run A inside the flagged
    intervals and outside them, and the intervals."""
    from benchmarks.between import flagged

    err = pd.DataFrame({"op": ["pingpong"] * 3 + ["bcast"], "link": ["intra"] * 4, "procs": [2] * 4,
                        "size": [2896, 4088, 11584, 2896], "cal_b": [0.5, 0.1, 0.03, 0.02],
                        "cal_a": [0.46, 0.04, 0.02, 0.03], "run_b": [0.02] * 4})
    text = flagged(err, [HiddenChange("pingpong", "intra", 2, 2048, 4096, 2.4, 2.0, (2896, 4092))])
    rows = {line.split()[0]: line.split() for line in text.splitlines()[1:]}
    assert rows["pingpong"][2:] == ["25.0%", "2.0%", "2048..4096", "B"]
    assert rows["bcast"][2:] == ["-", "3.0%", "none"]
