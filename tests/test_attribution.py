"""analysis.attribution against hand-computed tables: which link class carries a strategy's communication,
communication accuracy per link class, and measured / predicted step ratios per collective and link."""

import pandas as pd
import pytest

from analysis import attribution

STEPS = pd.DataFrame([
    # layer, strategy, op, link, predicted_s, measured_s
    ("L", "s1", "allgather", "inter", 0.010, 0.010),
    ("L", "s1", "allgather", "intra", 0.001, 0.002),
    ("L", "s1", "compute", "", 0.5, 0.9),               # not communication
    ("L", "s2", "alltoall", "intra", 0.002, 0.004),
    ("L", "s2", "alltoall", "intra", 0.002, 0.002),
    ("L", "s2", "slice", "inter", 0.0, 0.010),           # local, not a collective: carries no link
    ("L", "s3", "allreduce", "inter", 0.003, 0.003),     # a tie: the first link class by name
    ("L", "s3", "allreduce", "intra", 0.003, 0.003),
    ("M", "s1", "reduce_scatter", "intra", 0.004, 0.005),
], columns=["layer", "strategy", "op", "link", "predicted_s", "measured_s"])
FRAME = pd.DataFrame([
    # layer, strategy, comm_steps, predicted_comm_s, measured_comm_s
    ("L", "s1", 2, 0.011, 0.012),
    ("L", "s2", 2, 0.002, 0.004),
    ("L", "s3", 2, 0.006, 0.006),
    ("L", "s4", 0, 0.0, 0.0),                             # no communication: left out
    ("M", "s1", 1, 0.004, 0.005),
], columns=["layer", "strategy", "comm_steps", "predicted_comm_s", "measured_comm_s"])


def test_dominant_link_is_where_most_measured_time_went():
    got = attribution.dominant_link(STEPS).to_dict()
    assert got == {("L", "s1"): "inter", ("L", "s2"): "intra", ("L", "s3"): "inter", ("M", "s1"): "intra"}


def test_accuracy_per_link_class_is_the_layers_mean():
    got = attribution.link_accuracy(FRAME, STEPS, resamples=0, seed=0)
    assert got["inter"]["strategies"] == 2
    assert got["inter"]["comm_mean_accuracy"]["value"] == pytest.approx((1 - 1 / 12 + 1) / 2)
    assert got["intra"]["strategies"] == 2       # layer L: 0.5, layer M: 0.8; layers weigh alike
    assert got["intra"]["comm_mean_accuracy"]["value"] == pytest.approx((0.5 + 0.8) / 2)


def test_accuracy_interval_contains_the_value():
    acc = attribution.link_accuracy(FRAME, STEPS, resamples=200, seed=1)["inter"]["comm_mean_accuracy"]
    lo, hi = acc["ci95"]
    assert lo <= acc["value"] <= hi and lo >= 1 - 1 / 12 - 1e-12 and hi <= 1


def test_step_ratios_per_collective_and_link():
    got = {(r["op"], r["link"]): r for r in attribution.step_ratios(STEPS)}
    assert set(got) == {("allgather", "inter"), ("allgather", "intra"), ("alltoall", "intra"),
                        ("allreduce", "inter"), ("allreduce", "intra"), ("reduce_scatter", "intra")}
    a2a = got[("alltoall", "intra")]
    assert a2a["steps"] == 2 and a2a["median"] == pytest.approx(1.5) and a2a["quartiles"] == pytest.approx([1.25, 1.75])
    assert got[("allgather", "intra")]["median"] == pytest.approx(2.0)
    assert got[("reduce_scatter", "intra")]["median"] == pytest.approx(1.25)


def test_steps_of_a_model_priced_at_the_fast_one_of_several_speeds_are_counted_when_slow():
    """Where the calibration priced a collective at the fast one of several speeds, the steps that ran more than
    SPEED_GAP over their price are counted and named as its slow speeds; other collectives carry no such fields."""
    got = {(r["op"], r["link"]): r for r in attribution.step_ratios(STEPS, {("alltoall", "intra"): 1.96,
                                                                           ("allreduce", "intra"): 1.5})}
    assert got[("alltoall", "intra")]["slow_steps"] == 1 and got[("alltoall", "intra")]["sweep_slow_ratio"] == 1.96
    assert got[("allreduce", "intra")]["slow_steps"] == 0
    assert "slow_steps" not in got[("allgather", "intra")]      # 2x its price, but priced at one speed
    text = attribution.describe({}, list(got.values()))
    assert "(2); 1 over 1.15x, priced at the fast one of the speeds its sweep's calls ran at (up to 1.96x)" in text
    assert "allreduce/intra        1.000 [1.000, 1.000] (1)\n" in text + "\n"


def test_each_collective_gets_the_verdict_of_its_median_step_ratio():
    """Within OFF_PRICE of the price: priced; for a collective priced at the fast one of several speeds, from
    SPEED_GAP over the price (less OFF_PRICE for the price's own error) up to the slowest recorded speed (plus
    OFF_PRICE): a recorded slow speed; off the price otherwise: slower or faster."""
    got = {(r["op"], r["link"]): r["verdict"] for r in attribution.step_ratios(STEPS, {("alltoall", "intra"): 1.96,
                                                                                      ("allgather", "intra"): 1.5})}
    assert got == {("allgather", "inter"): "priced", ("allreduce", "inter"): "priced", ("allreduce", "intra"): "priced",
                   ("alltoall", "intra"): "slow_speed",      # 1.5x, recorded up to 1.96x
                   ("allgather", "intra"): "slower",         # 2x, past the recorded 1.5x and its 5%
                   ("reduce_scatter", "intra"): "slower"}    # 1.25x, no speed recorded
    v = attribution.verdict
    assert v(1.049, None) == "priced" and v(0.951, 1.5) == "priced" and v(0.94, 1.5) == "faster"
    assert v(1.09, 1.5) == "slower" and v(1.10, 1.5) == "slow_speed"     # a pricing error under the slow band
    assert v(1.5 * 1.05, 1.5) == "slow_speed" and v(1.5 * 1.06, 1.5) == "slower"
    text = attribution.describe({}, attribution.step_ratios(STEPS, {("alltoall", "intra"): 1.96}))
    assert "(up to 1.96x); at a slow speed the calibration records" in text
    assert "(1); slower than priced, at no speed the calibration records" in text


def test_a_launch_is_slow_only_where_every_collective_ran_slower_than_its_price():
    ratios = attribution.step_ratios(STEPS)
    assert not attribution.slow_launch(ratios) and not attribution.slow_launch([])       # some ran as priced
    slow = STEPS.assign(measured_s=STEPS["predicted_s"] * 2.5)
    assert attribution.slow_launch(attribution.step_ratios(slow))
    # a slow speed recorded (at whatever size) does not clear a launch that ran every collective slow
    assert attribution.slow_launch(attribution.step_ratios(slow, {("alltoall", "intra"): 2.5}))
    half = STEPS.assign(measured_s=STEPS["predicted_s"] * STEPS["op"].map({"allgather": 1.0}).fillna(2.5))
    assert not attribution.slow_launch(attribution.step_ratios(half, {("alltoall", "intra"): 2.5}))


def test_describe_names_every_link_and_collective():
    text = attribution.describe(attribution.link_accuracy(FRAME, STEPS, 0, 0), attribution.step_ratios(STEPS))
    assert "inter    0.9583  (2 strategies)" in text and "alltoall/intra" in text and "1.500 [1.250, 1.750] (2)" in text


def test_describe_is_empty_without_communication():
    only_compute = STEPS[STEPS["op"] == "compute"]
    assert attribution.step_ratios(only_compute) == []
    assert attribution.link_accuracy(FRAME[FRAME["comm_steps"] == 0], only_compute, 10, 0) == {}
    assert attribution.describe({}, []) == ""
