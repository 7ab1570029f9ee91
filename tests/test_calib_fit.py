"""The fit against known truth: synthetic sweeps from given alpha/beta per algorithm model, with sample noise,
outlying iterations and bad points; the fit must recover the parameters, the algorithm and planted change points."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calib.algorithms import algorithm
from calib.calibration import calibration_from_dict
from calib.fit import FitOptions, fit_model, fit_result
from calib.points import RunSet, load_runs
from calib.segments import PiecewiseFit, Points, fit_piecewise
from calib.synthetic import Segment, TrueModel, write_synthetic_run

TRUTH = {
    ("allreduce", "inter"): TrueModel.line(25e-6, 1.1e-9, "ring"),
    ("allreduce", "intra"): TrueModel.line(4e-6, 3e-10, "recursive_doubling"),
    ("allgather", "inter"): TrueModel.line(15e-6, 9e-10, "recursive_blocks"),
    ("bcast", "inter"): TrueModel.line(12e-6, 1.3e-9, "linear"),
    ("alltoall", "intra"): TrueModel.line(6e-6, 5e-10, "ring_blocks"),
}
KNEE = 65536
PINGPONG = TrueModel((Segment(KNEE, 8e-6, 1.5e-9), Segment(math.inf, 45e-6, 0.9e-9)))
PROCS = {"inter": [2, 4, 8], "intra": [2, 4, 8]}


DATA = Path(__file__).parent / "data"


def fit_calibration(runs, opts: FitOptions = FitOptions()) -> dict:
    """The fit as the calibration file's dict."""
    return fit_result(runs, opts).to_json()


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    run = write_synthetic_run(tmp_path_factory.mktemp("syn") / "run", {**TRUTH, ("pingpong", "inter"): PINGPONG},
                              PROCS, samples=15, noise=0.03, outlier_fraction=0.05, gemm={"float64": 2e10},
                              copy=(3e-6, 8e9), seed=3)
    cal = fit_calibration(load_runs([str(run)]))
    calibration_from_dict(cal)
    return cal


@pytest.mark.parametrize("key", list(TRUTH))
def test_recovers_alpha_beta_and_picks_the_generating_algorithm(fitted, key):
    op, link = key
    truth = TRUTH[key]
    m = fitted["models"][op][link]
    assert m["algorithm"] == truth.algorithm
    assert m["identifiable"]
    assert len(m["segments"]) == 1
    seg = truth.segments[0]
    assert m["alpha_s"] == pytest.approx(seg.alpha_s, rel=0.05)
    assert m["beta_s_per_byte"] == pytest.approx(seg.beta_s_per_byte, rel=0.03)
    lo, hi = m["beta_ci95_s_per_byte"]
    assert lo < m["beta_s_per_byte"] < hi
    others = [c["heldout_median_abs_rel_err"] for c in m["candidates"] if c["algorithm"] != truth.algorithm]
    assert m["heldout"]["median_abs_rel_err"] < 0.02
    assert all(o > 2 * m["heldout"]["median_abs_rel_err"] for o in others)


def test_finds_a_planted_change_point(fitted):
    m = fitted["models"]["pingpong"]["inter"]
    segs = m["segments"]
    assert len(segs) == 2
    assert segs[0]["max_bytes"] < KNEE <= segs[1]["min_bytes"]
    for fit, truth in zip(segs, PINGPONG.segments):
        assert fit["alpha_s"] == pytest.approx(truth.alpha_s, rel=0.1)
        assert fit["beta_s_per_byte"] == pytest.approx(truth.beta_s_per_byte, rel=0.03)
    p2p = fitted["p2p"]["pingpong"]["inter"]
    assert p2p["beta_s_per_byte"] == pytest.approx(0.9e-9, rel=0.03)
    assert p2p["bandwidth_bytes_per_s"] == pytest.approx(1 / 0.9e-9, rel=0.03)


def test_a_regime_of_three_sizes_gets_its_own_segment_where_held_out_error_says_so(tmp_path):
    """A rate-limited link: flat latency to 8 KiB, a token bucket's burst to 64 KiB, the limit beyond. With at
    least 4 sizes per segment the 16-64 KiB regime has no line of its own; the fit also tries 3, keeps it for its
    lower held-out error, and records it."""
    burst = TrueModel((Segment(16384, 80e-6, 1e-9), Segment(131072, 20e-6, 1e-8), Segment(math.inf, 0.0, 4e-8)),
                      "ring")
    sizes = tuple(2 ** k for k in range(10, 25))                     # 1 KiB .. 16 MiB, as bench_validate
    run = write_synthetic_run(tmp_path / "run", {("allreduce", "inter"): burst}, {"inter": [2]}, sizes=sizes,
                              samples=15, noise=0.02, seed=5)
    runs = load_runs([str(run)])
    cals = [fit_calibration(runs, opts) for opts in (FitOptions(), FitOptions(min_sizes=(4,)))]
    m, four = (c["models"]["allreduce"]["inter"] for c in cals)
    assert m["min_segment_sizes"] == 3 and four["min_segment_sizes"] == 4
    assert [s["max_bytes"] for s in m["segments"]] == [8192, 65536, 2 ** 24]
    assert m["heldout"]["median_abs_rel_err"] < four["heldout"]["median_abs_rel_err"]
    regime = np.array([16384.0, 32768.0, 65536.0])
    off = [np.abs(calibration_from_dict(c).predict_seconds("allreduce", "inter", 2, regime)
                  / burst.seconds("allreduce", 2, regime) - 1).max() for c in cals]
    assert off[0] < 0.02 and off[1] > 0.1, off


def test_held_out_error_overrides_bic_where_an_unfittable_regime_stops_it_splitting(tmp_path):
    """Latency that doubles between 2 and 4 KiB (a regime of 2 sizes, fewer than a segment may span) and a bandwidth
    that drops 19% past 1 MiB, as a 2-rank intra-node allreduce measured here: the small sizes' misfit inflates
    BIC's residual variance whatever the segments, so BIC alone puts 128 KiB-16 MiB on too few lines; a fixed
    number of segments with a far lower held-out error replaces it."""
    truth = TrueModel((Segment(2048, 7e-6, 1e-9), Segment(8192, 17e-6, 1e-10), Segment(1048576, 10e-6, 1.08e-9),
                       Segment(math.inf, -100e-6, 1.33e-9)), "ring")
    sizes = tuple(2 ** k for k in range(10, 25))
    run = write_synthetic_run(tmp_path / "run", {("allreduce", "intra"): truth}, {"intra": [2]}, sizes=sizes,
                              samples=15, noise=0.03, outlier_fraction=0.05, seed=1)
    runs = load_runs([str(run)])
    big = np.array([2.0 ** k for k in range(17, 25)])
    cal = fit_calibration(runs)
    m = cal["models"]["allreduce"]["intra"]
    off = np.abs(calibration_from_dict(cal).predict_seconds("allreduce", "intra", 2, big)
                 / truth.seconds("allreduce", 2, big) - 1).max()
    pts = runs.points[runs.points["op"] == "allreduce"]
    bic = fit_piecewise(algorithm("ring"), Points.build(pts["procs"], pts["size_bytes"], pts["seconds"],
                                                        pts["requested_bytes"]), "wls", 5, 4)
    bic_off = np.abs(bic.predict(np.full(len(big), 2.0), big) / truth.seconds("allreduce", 2, big) - 1).max()
    assert bic_off > 0.08 and len(bic.segments) < 3, (bic_off, len(bic.segments))
    assert off < 0.03 and len(m["segments"]) >= 3, (off, m["segments"])
    assert m["heldout"]["median_abs_rel_err"] < 0.03


AFTER_GEMM_ALLGATHER = {8: 4.485e-05, 512: 2.914e-05, 4096: 5.579e-05, 32768: 6.97e-05, 262144: 0.001696,
                        524288: 0.00464, 1048576: 0.01017, 2097152: 0.02172, 3145728: 0.03265, 4194304: 0.04402}
"""Seconds per size of a real after-compute all-gather between two nodes at 400 mbit (the control's sweep of
2026-11-28 04:19, tests/test_cluster.py): scattered below 256 KiB after the GEMM, on one line from 512 KiB up."""


def test_a_segmentation_that_misses_the_largest_sizes_is_not_scored_by_the_folds_own_splits():
    """On these points BIC on all sizes kept one segment (a line 38% under 4 MiB: its capped residuals tied two
    segments') while BIC on each fold's fewer sizes split, so the held-out check scored two segments and the fit
    shipped one. Scored at the number of segments it ships, one segment loses to two, and the bandwidth sizes are
    priced within 5%."""
    sizes = np.array(list(AFTER_GEMM_ALLGATHER), dtype=float)
    seconds = np.array(list(AFTER_GEMM_ALLGATHER.values()))
    df = pd.DataFrame({"procs": 2, "size_bytes": sizes, "requested_bytes": sizes, "seconds": seconds,
                       "launches": 2, "launch_spread": 0.0})
    model, _ = fit_model("allgather", "inter", df, FitOptions())
    assert len(model.segments) >= 2, model.segments
    top = sizes >= 524288
    pred = PiecewiseFit(algorithm(model.algorithm), model.segments).predict(np.full(top.sum(), 2.0), sizes[top])
    assert np.abs(pred / seconds[top] - 1).max() < 0.05, pred / seconds[top] - 1
    assert model.heldout.median_abs_rel_err < 0.15


@pytest.mark.parametrize("seed", range(3))
def test_no_segment_prices_a_size_it_covers_below_zero(tmp_path, seed):
    """A rate-limited link's ping-pong (a token bucket: sizes within its burst pass fast, larger ones at the rate
    less the burst, a line of negative intercept, curving near the burst) on the racks test's sizes: a segment from
    32 KiB up fits 32 KiB on a line that crosses zero just below it and would price 12-28 KiB messages below zero.
    Every size from 1 B to 8 MiB must be priced above zero, and the rate within 3%."""
    rate = 23.91e6
    truth = TrueModel((Segment(20000, 45e-6, 3.7e-9), Segment(100000, 0.2e-3 - 32768 / rate / 3, 1 / rate / 3),
                       Segment(300000, 9.8e-3 - 262144 / rate, 1 / rate), Segment(math.inf, -2.11e-3, 1 / rate)))
    sizes = (8, 512, 4096, 32768, 262144, 524288, 1 << 20, 2 << 20, 3 << 20, 4 << 20)
    run = write_synthetic_run(tmp_path / "run", {("pingpong", "inter"): truth}, {"inter": [2]}, sizes=sizes,
                              samples=12, noise=0.03, seed=seed)
    data = fit_calibration(load_runs([str(run)]))
    grid = np.unique(np.geomspace(1, 8 << 20, 400).astype(int)).astype(float)
    priced = calibration_from_dict(data).predict_seconds("pingpong", "inter", 2, grid)
    assert (priced > 0).all(), grid[priced <= 0]
    bandwidth = data["p2p"]["pingpong"]["inter"]["bandwidth_bytes_per_s"]
    assert abs(bandwidth / rate - 1) < 0.03, bandwidth / rate - 1


def test_the_racks_sweep_that_missed_its_rate_is_fitted_at_its_truth():
    """The real ping-pong sweep of the 4-node racks cluster (tests/data/runs/racks-pingpong-tbf: in-rack links at
    400mbit, cross-rack at 200mbit) on which tests/test_cluster_racks.py once failed: its cross-rack segment from
    32 KiB up read 25.13 MB/s (+5.1%). Both levels' rates within 2% of tbf's payload rates."""
    data = fit_calibration(load_runs([str(DATA / "runs" / "racks-pingpong-tbf")]))
    for link, mbit in (("inter", 400), ("inter2", 200)):
        truth = mbit * 1e6 / 8 * 1448 / 1514
        bandwidth = data["p2p"]["pingpong"][link]["bandwidth_bytes_per_s"]
        assert abs(bandwidth / truth - 1) < 0.02, (link, bandwidth / truth - 1)


def _racks_with_slow_calls(tmp_path, link: str, sizes: list[int], slow_calls) -> tuple[RunSet, pd.Series]:
    """A copy of the racks sweep with the calls `slow_calls(iteration)` picks at `link`'s `sizes` run 1.9x slower."""
    import shutil
    run = tmp_path / "run"
    shutil.copytree(DATA / "runs" / "racks-pingpong-tbf", run)
    summary = pd.read_parquet(run / "summary.parquet")
    slowed = summary.loc[(summary["link"] == link) & summary["size_bytes"].isin(sizes), "point_id"].astype(str)
    samples = pd.read_parquet(run / "samples.parquet")
    hit = samples["point_id"].astype(str).isin(slowed) & slow_calls(samples["iteration"])
    samples.loc[hit, "time_s"] *= 1.9
    samples.to_parquet(run / "samples.parquet")
    return load_runs([str(run)]), slowed


def test_points_whose_calls_ran_at_two_speeds_are_priced_at_the_fast_one(tmp_path):
    """The racks sweep with three of a cross-rack level's sizes rewritten as Open MPI's TCP rendezvous ran exchanges
    between the nodes: three of every five calls at 1.9x the wire time, so the pooled medians lie on the slow speed.
    The calibration still prices those sizes and the level's rate within 2% of the untouched fit's (priced at the
    pooled medians they were 1.2-1.9x), and counts and names those points."""
    runs, slowed = _racks_with_slow_calls(tmp_path, "inter2", [1 << 20, 2 << 20, 4 << 20], lambda it: it % 5 < 3)
    assert (runs.points.loc[runs.points["point_id"].isin(slowed), "slow_ratio"] > 1.5).all()
    clean = fit_calibration(load_runs([str(DATA / "runs" / "racks-pingpong-tbf")]))
    data = fit_calibration(runs)
    rate = data["p2p"]["pingpong"]["inter2"]["bandwidth_bytes_per_s"]
    assert rate / clean["p2p"]["pingpong"]["inter2"]["bandwidth_bytes_per_s"] == pytest.approx(1, abs=0.02)
    sizes = np.array([1 << 20, 2 << 20, 3 << 20, 4 << 20], dtype=float)
    priced = [calibration_from_dict(d).predict_seconds("pingpong", "inter2", 2, sizes) for d in (data, clean)]
    assert np.allclose(priced[0] / priced[1], 1, atol=0.02), priced[0] / priced[1]   # pooled medians: 1.2-1.9x
    model = data["models"]["pingpong"]["inter2"]
    assert model["speeds"]["n_points"] >= 3 and model["speeds"]["max_ratio"] > 1.5
    at = dict(zip(model["speeds"]["sizes"], model["speeds"]["ratios"]))        # version 19: the ratio at each size
    assert model["speeds"]["sizes"] == sorted(at) and max(at.values()) == model["speeds"]["max_ratio"]
    assert min(at[s] for s in (1 << 20, 2 << 20, 4 << 20)) > 1.5 and at.get(3 << 20, 1.0) < 1.5
    assert all(r == 1.0 for s, r in at.items() if s < 1 << 20)
    assert any("ran at several speeds" in w for w in model["warnings"])
    assert "speeds" not in clean["models"]["pingpong"]["inter"]
    assert calibration_from_dict(data).data["version"] == 20


def test_a_sustained_fast_minority_is_priced_and_a_token_buckets_burst_is_not(tmp_path):
    """Open MPI's TCP rendezvous between two nodes runs a launch's exchanges at the wire time in anything from none to
    most of its calls. The racks sweep with nine of every ten calls at 1-4 MiB of the cross-rack level run 1.9x slower
    (a tenth fast, below the quarter that makes a speed): those sizes are still priced at the fast speed, within 2% of
    the untouched fit, and counted. The untouched sweep's own fast minorities, at 32 KiB on both levels, are the token
    bucket's 64 KiB burst (2.4-3.1x faster than the rest, faster than any size's rate): not priced."""
    runs, slowed = _racks_with_slow_calls(tmp_path, "inter2", [1 << 20, 2 << 20, 4 << 20], lambda it: it % 10 > 0)
    minority = runs.points[runs.points["point_id"].isin(slowed)]
    assert (minority["slow_ratio"] > 1.5).all(), minority
    data, clean_runs = fit_calibration(runs), load_runs([str(DATA / "runs" / "racks-pingpong-tbf")])
    clean = fit_calibration(clean_runs)
    sizes = np.array([1 << 20, 2 << 20, 3 << 20, 4 << 20], dtype=float)
    priced = [calibration_from_dict(d).predict_seconds("pingpong", "inter2", 2, sizes) for d in (data, clean)]
    assert np.allclose(priced[0] / priced[1], 1, atol=0.02), priced[0] / priced[1]   # pooled medians: 1.9x
    assert data["models"]["pingpong"]["inter2"]["speeds"]["n_points"] >= 3
    burst = load_runs([str(DATA / "runs" / "racks-pingpong-tbf")]).points
    assert list(burst.loc[burst["slow_ratio"] > 1, "size_bytes"]) == []
    for link in ("inter", "inter2"):
        assert "speeds" not in clean["models"]["pingpong"][link], clean["models"]["pingpong"][link]["speeds"]


def test_a_fast_minority_in_the_latency_regime_or_of_a_local_operation_is_not_priced():
    """calib.points.sustained_minorities prices a fast minority only where the point is bandwidth-bound, moves its
    bytes no faster than the largest size does, and is communication."""
    from calib.points import sustained_minorities
    rows = [("allgather", 1 << 10, 50e-6, 25e-6),      # latency regime: 1 KiB at 100 MB/s is 10 us of 50
            ("allgather", 32 << 10, 330e-6, 60e-6),    # a burst: 550 MB/s
            ("allgather", 4 << 20, 84e-3, 43e-3),      # rendezvous overlapped in a few calls: 98 MB/s
            ("allgather", 8 << 20, 168e-3, 86e-3),     # the largest size: its rate is the sustained one
            ("gemm", 8 << 20, 10e-3, 5e-3)]            # not communication
    points = pd.DataFrame([{"backend": "mpi", "op": op, "link": "inter" if op != "gemm" else "local", "procs": 2,
                            "groups": 1, "size_bytes": n, "seconds": t, "slow_ratio": 1.0, "minority_s": m,
                            "minority_ratio": t / m} for op, n, t, m in rows])
    priced = sustained_minorities(points)
    assert "minority_s" not in priced and "minority_ratio" not in priced
    assert list(priced["seconds"]) == [50e-6, 330e-6, 43e-3, 86e-3, 10e-3]
    assert list(priced["slow_ratio"] > 1) == [False, False, True, True, False]


def test_a_quarter_of_calls_in_a_token_buckets_burst_is_not_the_price():
    """A point whose calls split into two speeds each held by a quarter of them is priced at the faster only where
    that speed moves its bytes no faster than the largest size does: inside a token bucket's burst a quarter of the
    calls can find the bucket full (an all-gather's 46344 B at 0.070 ms against a median of 0.47 ms, 400mbit)."""
    from calib.points import sustained_minorities
    rows = [("allgather", 46344, 70e-6, 0.47e-3 / 70e-6),    # a burst: 660 MB/s; priced at its slower speed
            ("allgather", 1 << 20, 21e-3, 1.45),             # the rendezvous overlapped: the wire's 50 MB/s, kept
            ("allgather", 4 << 20, 84e-3, 1.0)]              # the largest size
    points = pd.DataFrame([{"backend": "mpi", "op": op, "link": "inter", "procs": 2, "groups": 1, "size_bytes": n,
                            "seconds": t, "slow_ratio": r, "minority_s": np.nan, "minority_ratio": np.nan}
                           for op, n, t, r in rows])
    priced = sustained_minorities(points)
    assert list(priced["seconds"]) == pytest.approx([0.47e-3, 21e-3, 84e-3])
    assert list(priced["slow_ratio"]) == pytest.approx([1.0, 1.45, 1.0])
    # after idle time (sweep --after-gemm, --gap-ms) the bucket is full when a call starts: the burst is the price
    after = sustained_minorities(points, after_idle=True)
    assert list(after["seconds"]) == pytest.approx([70e-6, 21e-3, 84e-3])


def test_hockney_table_per_process_count_matches_the_model(fitted):
    rows = [r for r in fitted["hockney"] if r["op"] == "allreduce" and r["link"] == "inter"]
    assert sorted(r["procs"] for r in rows) == [2, 4, 8]
    seg = TRUTH[("allreduce", "inter")].segments[0]
    for r in rows:
        p = r["procs"]
        assert r["alpha_s"] == pytest.approx(2 * (p - 1) * seg.alpha_s, rel=0.05)
        assert r["beta_s_per_byte"] == pytest.approx(2 * (p - 1) / p * seg.beta_s_per_byte, rel=0.03)
        assert r["r2"] > 0.99


def test_gemm_rate_and_saturation(fitted):
    g = fitted["compute"]["gemm"]["float64"]
    assert g["flops_per_s"] == pytest.approx(2e10, rel=0.05)
    assert 0 < g["saturation_bytes"] < 64 * 2 ** 20
    assert g["latency_s"] == pytest.approx(5e-6, rel=0.2)       # the synthetic per-call cost
    assert g["groups_per_node"] == 1
    c = fitted["compute"]["copy"]
    assert c["bytes_per_s"] == pytest.approx(8e9, rel=0.05) and c["latency_s"] == pytest.approx(3e-6, rel=0.2)
    assert "copy" not in fitted["models"] and not any(r["op"] == "copy" for r in fitted["hockney"])


def test_the_default_fit_resists_points_at_another_speed_than_their_neighbours(tmp_path):
    """A few sizes measured at another speed (a transport's mode drawn per point) move the default (Huber) line
    little; least squares weighing every point alike is pulled toward them."""
    truth = TrueModel.line(20e-6, 1e-9, "ring")
    run = write_synthetic_run(tmp_path / "run", {("allreduce", "inter"): truth}, {"inter": [2, 4, 8]},
                              noise=0.01, bad_points=6, seed=11)
    runs = load_runs([str(run)])
    m = fit_calibration(runs, FitOptions(max_segments=1))["models"]["allreduce"]["inter"]
    plain = fit_calibration(runs, FitOptions(method="wls", max_segments=1))["models"]["allreduce"]["inter"]
    assert m["fit_method"] == "huber" and plain["fit_method"] == "wls"
    assert m["algorithm"] == "ring"
    assert m["alpha_s"] == pytest.approx(20e-6, rel=0.05)
    assert m["beta_s_per_byte"] == pytest.approx(1e-9, rel=0.03)
    off = lambda model: abs(model["alpha_s"] / 20e-6 - 1) + abs(model["beta_s_per_byte"] / 1e-9 - 1)  # noqa: E731
    assert off(m) < off(plain) / 2, (m, plain)


@pytest.mark.parametrize("method", ["huber", "wls"])
def test_held_out_refits_price_as_the_statsmodels_fit_does(method):
    """The held-out folds' refits (segments.line_params, no statistics) give the prices of fit_line's statsmodels
    fit: to rounding for WLS, to the iteration's tolerance for Huber (rarely 0.5%, where Huber's MAD scale moves
    slowly, statsmodels' own stopping point as far from the converged one)."""
    from calib.segments import fit_line, line_params

    rng = np.random.default_rng(1)
    diffs = []
    for _ in range(200):
        sizes = np.geomspace(1024, 4e6, rng.integers(3, 12)).round()
        procs = rng.choice([2, 4, 8], size=rng.integers(1, 3), replace=False)
        p, n = (a.ravel().astype(float) for a in np.meshgrid(procs, sizes))
        alg = algorithm("ring")
        a, b = alg.coefficients(p)
        t = (a * 5e-6 + b * n * 1e-9) * (1 + 0.02 * rng.standard_normal(len(n)))
        bad = rng.random(len(n)) < 0.2
        t[bad] *= rng.choice([1.4, 0.7], size=int(bad.sum()))
        pts = Points.build(p, n, t, n)
        full, fast = fit_line(alg, pts, method), line_params(alg, pts, method)
        assert (fast.min_bytes, fast.max_bytes) == (full.min_bytes, full.max_bytes)
        priced = [s.alpha_s * a + s.beta_s_per_byte * b * n for s in (full, fast)]
        diffs.append(float(np.max(np.abs(priced[0] - priced[1]) / t)))
    assert np.quantile(diffs, 0.95) < 1e-6 and max(diffs) < 0.01, sorted(diffs)[-5:]


def test_poor_and_thin_fits_are_warned_in_the_file(tmp_path):
    noisy = write_synthetic_run(tmp_path / "noisy", {("allreduce", "inter"): (20e-6, 1e-9)}, {"inter": [2]},
                                noise=0.6, samples=3, seed=5)
    cal = fit_calibration(load_runs([str(noisy)]))
    m = cal["models"]["allreduce"]["inter"]
    assert not m["identifiable"]
    assert any("not identifiable" in w for w in m["warnings"])
    assert any("exceeds" in w for w in m["warnings"]), m["heldout"]
    assert set(m["warnings"]) <= set(cal["warnings"])
    thin = write_synthetic_run(tmp_path / "thin", {("allreduce", "inter"): (20e-6, 1e-9)}, {"inter": [2]},
                               sizes=(8, 1024))
    cal = fit_calibration(load_runs([str(thin)]))
    assert "allreduce" not in cal["models"]
    assert any("too few" in w for w in cal["warnings"])


def test_several_runs_fit_together(tmp_path):
    model = {("allreduce", "inter"): TrueModel.line(20e-6, 1e-9)}
    a = write_synthetic_run(tmp_path / "a", model, {"inter": [2]}, seed=1, run_id="a")
    b = write_synthetic_run(tmp_path / "b", model, {"inter": [4, 8]}, seed=2, run_id="b")
    cal = fit_calibration(load_runs([str(a), str(b)]))
    m = cal["models"]["allreduce"]["inter"]
    assert m["procs_measured"] == [2, 4, 8] and m["identifiable"]
    assert cal["provenance"]["run_ids"] == ["a", "b"]
    assert cal["link_classes"]["inter"]["procs"] == [2, 4, 8]


def test_calib_never_imports_mpi4py():
    code = ("import sys, calib.fit, calib.fit_cmd, calib.table_cmd, calib.synthetic, "
            "calib.calibration, calib.tables; assert 'mpi4py' not in sys.modules, 'mpi4py imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_predictions_of_a_fit_follow_the_data(fitted):
    cal = calibration_from_dict(fitted)
    seg = TRUTH[("allreduce", "inter")].segments[0]
    n = np.array([1e3, 1e6, 3e7])
    want = 2 * 7 * seg.alpha_s + 2 * 7 / 8 * n * seg.beta_s_per_byte
    np.testing.assert_allclose(cal.predict_seconds("allreduce", "inter", 8, n), want, rtol=0.04)
    pred = cal.predict("allreduce", "inter", 16, 1e6)
    assert pred.extrapolated and "procs 16 not measured" in pred.note
    assert pred.low_s < pred.seconds < pred.high_s


def test_a_slow_visit_with_many_samples_does_not_set_a_points_median(tmp_path):
    """Samples in rounds: one point gets a first visit in a disturbed window (3x slower, 40 samples) and two quick
    visits; the fit sees the median with every visit weighing the same, as the sweep's summary does."""
    import pandas as pd

    run = write_synthetic_run(tmp_path / "run", {("allreduce", "intra"): (4e-6, 3e-10)}, {"intra": [2]}, samples=10,
                              noise=0.0)
    samples = pd.read_parquet(run / "samples.parquet")
    pid = str(samples["point_id"].iloc[0])
    base = float(samples.loc[samples["point_id"] == pid, "time_s"].median())
    slow = pd.DataFrame({"run_id": samples["run_id"].iloc[0], "point_id": pid, "iteration": range(40),
                         "time_s": 3 * base, "round": 0})
    quick = samples[samples["point_id"] == pid].assign(round=lambda f: np.arange(len(f)) % 2 + 1)
    rest = samples[samples["point_id"] != pid].assign(round=0)
    pd.concat([slow, quick, rest], ignore_index=True).astype({"point_id": str, "run_id": str}).to_parquet(
        run / "samples.parquet")
    pts = load_runs([str(run)]).points.set_index("point_id")
    assert pts.loc[pid, "n_samples"] == 50
    assert pts.loc[pid, "seconds"] == pytest.approx(base)          # plain pooling: 3 * base


def test_fit_warns_about_each_host_the_hypervisor_took_much_cpu_time_from(tmp_path):
    run = write_synthetic_run(tmp_path / "run", {("allreduce", "intra"): TRUTH[("allreduce", "intra")]},
                              {"intra": [2]}, samples=5, seed=1)
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(meta | {"cpu_steal": {"node1": 0.34, "node2": 0.049, "node3": None}}))
    cal = fit_calibration(load_runs([str(run)]))
    steal = [w for w in cal["warnings"] if "cpu_steal" in w]
    assert len(steal) == 1 and "34% of node1's CPU time" in steal[0]
    (run / "run.json").write_text(json.dumps(meta))        # sweeps from before the record: no warning
    assert not [w for w in fit_calibration(load_runs([str(run)]))["warnings"] if "cpu_steal" in w]


def test_fit_warns_about_a_sweep_whose_ranks_outnumbered_a_machines_cpus(tmp_path):
    run = write_synthetic_run(tmp_path / "run", {("allreduce", "intra"): TRUTH[("allreduce", "intra")]},
                              {"intra": [2]}, samples=5, seed=1)
    meta = json.loads((run / "run.json").read_text())

    def sharing(value) -> list[str]:
        (run / "run.json").write_text(json.dumps(meta | {"cpu_sharing": value}))
        return [w for w in fit_calibration(load_runs([str(run)]))["warnings"] if "cpu_sharing" in w]

    said = sharing({"ranks": 4, "cpus": 2})
    assert len(said) == 1 and "4 ranks shared 2 CPU(s) of one machine" in said[0] and str(run) in said[0], said
    cal = calibration_from_dict(fit_calibration(load_runs([str(run)])))        # the schema holds the record
    assert cal.data["provenance"]["runs"][0]["cpu_sharing"] == {"ranks": 4, "cpus": 2}
    assert [a for a in cal.path_advice() if "more ranks than CPUs (4 ranks on 2 CPU(s)" in a], cal.path_advice()
    for value in (None, {"ranks": 2, "cpus": 2}, {"ranks": True, "cpus": 0}, {"ranks": 10 ** 30, "cpus": 1}, "4/2",
                  {"ranks": 4.0, "cpus": 2}, {"cpus": 2}, [4, 2]):      # a core per rank, or nothing a sweep writes
        assert sharing(value) == [], value
        cal = calibration_from_dict(fit_calibration(load_runs([str(run)])))
        assert "cpu_sharing" not in cal.data["provenance"]["runs"][0] and not [
            a for a in cal.path_advice() if "more ranks than CPUs" in a]


def test_between_size_benchmark_scores_the_calibration_at_sizes_the_fit_never_saw():
    """benchmarks.between: its sizes lie strictly between the grid's, and its table compares the calibration's
    error against the other run with the run-against-run error, per operation."""
    from benchmarks.between import between, table

    grid = [1 << k for k in range(10, 23)]
    mids = between(grid)
    assert mids and not set(mids) & set(grid)
    assert all(any(lo < m < hi for lo, hi in zip(grid, grid[1:])) for m in mids)
    err = pd.DataFrame({"op": ["a", "a", "b"], "link": ["intra"] * 3, "size": [1, 2, 3],
                        "cal_b": [0.05, 0.07, 0.30], "cal_a": [0.01, 0.02, 0.28], "run_b": [0.04, 0.06, 0.02]})
    text, met = table(err)
    assert not met and "MET" in text.splitlines()[1] and text.splitlines()[2].endswith("missed")


def test_launch_spread_takes_the_larger_of_within_and_between_runs_and_the_fit_warns_above_10_percent():
    """calib.fit.launch_spread per (procs, size): a sweep's own launches (launch_spread) or two runs fitted together
    (their medians' half range); fit_model warns, naming the worst size, when a point moves by more than 10%."""
    from calib.fit import FitOptions, fit_model, launch_spread

    sizes = [1 << k for k in range(10, 20)]
    rows = [{"procs": 2, "size_bytes": n, "requested_bytes": n, "launches": 2, "launch_spread": 0.01,
             "seconds": 1e-6 + n * 1e-10 * (3.0 if run and n == 4096 else 1.0)} for run in (0, 1) for n in sizes]
    df = pd.DataFrame(rows)
    spread = launch_spread(df)
    t = 1e-6 + 4096 * 1e-10
    assert spread.launches == 4 and spread.n_points == len(sizes) and spread.median == pytest.approx(0.01)
    half = 4096e-10                                  # half the range of 1x and 3x the byte term
    assert spread.max_at_bytes == 4096 and spread.max == pytest.approx(half / (t + half))
    model, warnings = fit_model("pingpong", "inter", df, FitOptions())
    assert model.launch_spread == spread
    assert any("move between MPI launches" in w and "4096 B" in w for w in warnings)
    quiet = df.assign(seconds=[1e-6 + n * 1e-10 for n in df.size_bytes])
    assert not any("MPI launches" in w for w in fit_model("pingpong", "inter", quiet, FitOptions())[1])
    assert launch_spread(quiet.assign(launches=1).iloc[:len(sizes)]) is None


def test_three_sizes_two_on_a_line_give_an_interval_not_a_point():
    """Huber's scale is the residuals' MAD, 0 when two of three points lie on the line: the segment's statistics
    then come from least squares, so a point 20% off the line widens the interval instead of vanishing from it."""
    from calib.segments import fit_line

    n = np.array([1024.0, 4096.0, 16384.0])
    t = 2e-6 + n * 1e-9
    t[1] *= 1.2
    pts = Points.build(np.full(3, 2.0), n, t, n)
    fit = fit_line(algorithm("p2p"), pts, "huber")
    assert fit.rel_resid_sd > 0.01 and fit.se[0] > 0 and fit.se[1] > 0, fit
    assert fit.ci95[1][0] < fit.beta_s_per_byte < fit.ci95[1][1]
    same = fit_line(algorithm("p2p"), Points.build(np.full(3, 2.0), n, 2e-6 + n * 1e-9, n), "huber")
    assert same.rel_resid_sd <= 1e-9                          # on the line: no scatter to report


def test_a_segment_exactly_on_its_line_fits_without_a_warning():
    """Points with no scatter (one rank's local operation at the timer's quantum: one time at every size) give
    Huber's scale 0, which statsmodels warns of; fit_line handles that case itself (least squares' statistics), so
    `commcal fit` prints nothing about it."""
    import warnings

    from calib.segments import fit_line

    fits = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for count in range(3, 9):                 # whether the residuals come out exactly 0 is floating point's say
            for first in (3, 6, 10, 13):
                n = 2.0 ** np.arange(first, first + count)
                fits.append(fit_line(algorithm("p2p"), Points.build(np.ones(count), n, np.full(count, 1e-7), n),
                                     "huber"))
    assert [str(w.message) for w in caught] == []
    assert all(f.alpha_s == pytest.approx(1e-7) and abs(f.beta_s_per_byte) < 1e-20 for f in fits)
    assert all(f.rel_resid_sd <= 1e-9 for f in fits)
