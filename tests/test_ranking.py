"""Ranking metrics against hand-computed cases (perfect, reversed, ties, single strategy) and scipy."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from analysis import ranking


def test_perfect_order():
    m = ranking.layer_metrics([1, 2, 3, 4], [10, 20, 30, 40], k=2)
    assert m["kendall_tau"] == pytest.approx(1) and m["spearman_rho"] == pytest.approx(1)
    assert m["top1"] == 1 and m["regret"] == 0 and m["pairwise_accuracy"] == 1 and m["topk_overlap"] == 1
    assert m["mean_accuracy"] == pytest.approx(1 - 0.9)


def test_reversed_order():
    m = ranking.layer_metrics([4, 3, 2, 1], [1, 2, 3, 4], k=2)
    assert m["kendall_tau"] == pytest.approx(-1) and m["spearman_rho"] == pytest.approx(-1)
    assert m["top1"] == 0 and m["regret"] == pytest.approx(3.0)
    assert m["pairwise_accuracy"] == 0 and m["topk_overlap"] == 0


def test_ties_count_against_the_prediction():
    m = ranking.layer_metrics([1, 1, 2], [1, 2, 3])
    # pairs (0,1) tied in prediction: 0; (0,2), (1,2) concordant: tau-b = 2 / sqrt(2 * 3)
    assert m["kendall_tau"] == pytest.approx(2 / math.sqrt(6))
    assert m["top1"] == 0 and m["regret"] == pytest.approx(1.0)      # the tied pick measured 2 vs best 1
    assert m["pairwise_accuracy"] == pytest.approx(2.5 / 3)
    assert m["topk_overlap"] == pytest.approx(1.0)                   # k = 3 = all strategies


def test_measured_ties_are_left_out_of_pairwise():
    m = ranking.layer_metrics([1, 2, 3], [5, 5, 6])
    assert m["pairwise_accuracy"] == pytest.approx(1.0)
    assert m["top1"] == 1 and m["regret"] == 0


def test_resolved_tau_judges_only_the_pairs_measured_apart():
    """A swap of two strategies measured within RESOLUTION of each other is left out; one measured further apart
    counts in full, and a predicted tie in such a pair counts against the model."""
    near = 1 + ranking.RESOLUTION / 2
    m = ranking.layer_metrics([1.0, 0.9, 3.0], [1.0, near, 2.0])
    assert m["kendall_tau"] == pytest.approx(1 / 3) and m["resolved_tau"] == pytest.approx(1.0)
    far = 1 + 2 * ranking.RESOLUTION
    assert ranking.layer_metrics([1.0, 0.9, 3.0], [1.0, far, 2.0])["resolved_tau"] == pytest.approx(1 / 3)
    assert ranking.layer_metrics([1.0, 1.0, 3.0], [1.0, far, 2.0])["resolved_tau"] == pytest.approx(2 / 3)
    assert ranking.layer_metrics([3.0, 2.0, 1.0], [1.0, 1.5, 2.0])["resolved_tau"] == pytest.approx(-1.0)
    assert ranking.layer_metrics([2.0, 1.0], [1.0, near])["resolved_tau"] is None     # no pair measured apart


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.floats(1, 2)), min_size=2, max_size=10))
def test_resolved_tau_is_kendall_tau_on_pairs_far_apart(pairs):
    """On every layer: where no measured pair lies within RESOLUTION and no measured or predicted pair ties,
    resolved tau is Kendall's; in general it is the concordant less the discordant pairs among those measured
    apart, over their count."""
    pred, meas = (np.array(v, dtype=float) for v in zip(*pairs))
    m = ranking.layer_metrics(pred, meas)
    i, j = np.triu_indices(len(pred), 1)
    apart = np.abs(meas[i] - meas[j]) > ranking.RESOLUTION * np.minimum(meas[i], meas[j])
    if not apart.any():
        assert m["resolved_tau"] is None
        return
    want = (np.sign(pred[i] - pred[j]) * np.sign(meas[i] - meas[j]))[apart].mean()
    assert m["resolved_tau"] == pytest.approx(want)
    if apart.all() and (pred[i] != pred[j]).all():
        assert m["resolved_tau"] == pytest.approx(m["kendall_tau"])


def test_single_strategy():
    m = ranking.layer_metrics([2.0], [1.0])
    assert m["kendall_tau"] is None and m["spearman_rho"] is None and m["pairwise_accuracy"] is None
    assert m["top1"] == 1 and m["regret"] == 0 and m["topk_overlap"] == 1 and m["mean_accuracy"] == pytest.approx(0)


def test_accuracy_is_paradl_definition():
    np.testing.assert_allclose(ranking.accuracy([0.9, 2.2], [1, 2]), [0.9, 0.9])


def test_bad_input():
    for pred, meas in (([1, 2], [1]), ([], []), ([1, 2], [1, 0]), ([1, np.nan], [1, 2])):
        with pytest.raises(ValueError):
            ranking.layer_metrics(pred, meas)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 5)), min_size=2, max_size=12))
def test_correlations_match_scipy(pairs):
    pred, meas = (np.array(v, dtype=float) for v in zip(*pairs))
    m = ranking.layer_metrics(pred, meas)
    if np.ptp(pred) == 0 or np.ptp(meas) == 0:
        assert m["kendall_tau"] is None and m["spearman_rho"] is None
        return
    assert m["kendall_tau"] == pytest.approx(stats.kendalltau(pred, meas)[0])
    assert m["spearman_rho"] == pytest.approx(stats.spearmanr(pred, meas)[0])


def test_score_over_layers_with_intervals():
    layers = [([1, 2, 3, 4], [1, 2, 3, 4]), ([4, 3, 2, 1], [1, 2, 3, 4]), ([1.0], [2.0])]
    out = ranking.score(layers, k=2, resamples=300, seed=1)
    assert out["kendall_tau"].value == pytest.approx(0.0)      # mean of 1 and -1; the single layer has none
    assert out["top1"].value == pytest.approx(2 / 3)
    for s in out.values():
        assert s.low <= s.value <= s.high
    noisy = ranking.score([([1, 2, 3, 4, 5, 6], [1, 3, 2, 6, 4, 5])], resamples=300)
    assert noisy["kendall_tau"].low < noisy["kendall_tau"].value < noisy["kendall_tau"].high
    none = ranking.score([([1.0], [1.0])], resamples=0)
    assert "kendall_tau" not in none and none["top1"].to_json() == {"value": 1.0, "ci95": None}


def test_one_run_scored_as_the_prediction_of_another():
    """repeat_frame pairs the strategies both runs measured; frame_scores scores them like validate does."""
    first = pd.DataFrame({"layer": ["a"] * 3 + ["b"] * 2, "strategy": ["x", "y", "z", "x", "y"],
                          "measured_s": [1.0, 2.0, 3.0, 5.0, 4.0], "measured_comm_s": [0.5, 1.0, 1.5, 0.0, 2.0],
                          "comm_steps": [1, 1, 1, 0, 2]})
    second = first.assign(measured_s=first.measured_s * 1.25, measured_comm_s=first.measured_comm_s * 0.8)
    second = pd.concat([second, second.iloc[:1].assign(strategy="only-here")]).iloc[::-1]
    both = ranking.repeat_frame(first, second)
    assert len(both) == 5 and set(both.columns) >= {"predicted_s", "measured_s", "predicted_comm_s"}
    m = ranking.flat(ranking.frame_scores(both, 3, 0, 0))
    assert m["kendall_tau"]["value"] == pytest.approx(1) and m["regret"]["value"] == 0
    assert m["mean_accuracy"]["value"] == pytest.approx(1 - 0.25 / 1.25)
    # communication: layer b has one communicating strategy, so its accuracy alone counts there
    assert m["comm_mean_accuracy"]["value"] == pytest.approx(1 - 0.25)
    assert m["comm_kendall_tau"]["value"] == pytest.approx(1) and m["comm_kendall_tau"]["ci95"] is None


def test_contenders_are_near_the_best_of_any_column_and_nan_ranks_nowhere():
    from analysis.validate_plan import contenders

    nan = float("nan")
    pred, pred_comm = [1.0, 1.05, 1.2, 2.0, 1.5], [nan, 0.5, 0.54, 0.6, 0.56]
    meas, meas_comm = [1.3, 1.0, 1.09, 3.0, 1.2], [nan, 0.7, 0.5, 0.9, 0.56]
    assert contenders([pred, pred_comm, meas, meas_comm], 0.1) == [0, 1, 2]
    assert contenders([pred, pred_comm, meas, meas_comm], 0.0) == [0, 1, 2]     # each column's own best
    assert contenders([pred, pred_comm, meas, meas_comm], 0.15) == [0, 1, 2, 4]
    assert contenders([pred], 0.0) == [0] and contenders([[2.0, 2.0, 3.0]], 0.0) == [0, 1]   # a tie keeps both
    assert contenders([[nan, nan], [3.0, 1.0]], 0.5) == [1]                       # an all-NaN column adds none
    assert contenders([pred, meas], 1.0) == [0, 1, 2, 3, 4]


def test_choose_keeps_all_or_the_predicted_top_half_and_a_seeded_sample():
    from analysis.validate_plan import choose

    times = np.arange(10.0)[::-1]
    assert choose(times, 10, 0) == [(i, "all") for i in range(10)]
    got = choose(times, 4, 7)
    assert got[:2] == [(9, "top"), (8, "top")] and [w for _, w in got[2:]] == ["sample", "sample"]
    assert len({i for i, _ in got}) == 4 and all(i < 8 for i, _ in got[2:]) and got == choose(times, 4, 7)
