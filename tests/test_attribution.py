"""analysis.attribution against hand-computed tables: which link class carries a strategy's communication,
communication accuracy per link class, and measured / predicted step ratios per collective and link."""

import pandas as pd
import pytest

from analysis import attribution
from calib.result import Speeds


def recorded(max_ratio: float, sizes=None, ratios=None) -> tuple[Speeds, ...]:
    """A model's speeds: max_ratio alone (a calibration before version 19), or the ratio at each size."""
    return (Speeds(1, 9, max_ratio, 8.0, 2, sizes, ratios),)

STEPS = pd.DataFrame([
    # layer, strategy, op, link, size_bytes, predicted_s, measured_s
    ("L", "s1", "allgather", "inter", 1 << 20, 0.010, 0.010),
    ("L", "s1", "allgather", "intra", 1 << 20, 0.001, 0.002),
    ("L", "s1", "compute", "", 0, 0.5, 0.9),               # not communication
    ("L", "s2", "alltoall", "intra", 1 << 20, 0.002, 0.004),
    ("L", "s2", "alltoall", "intra", 3 << 18, 0.002, 0.002),
    ("L", "s2", "slice", "inter", 0, 0.0, 0.010),           # local, not a collective: carries no link
    ("L", "s3", "allreduce", "inter", 1 << 20, 0.003, 0.003),     # a tie: the first link class by name
    ("L", "s3", "allreduce", "intra", 1 << 20, 0.003, 0.003),
    ("M", "s1", "reduce_scatter", "intra", 1 << 20, 0.004, 0.005),
], columns=["layer", "strategy", "op", "link", "size_bytes", "predicted_s", "measured_s"])
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
    got = {(r["op"], r["link"]): r for r in attribution.step_ratios(STEPS, {("alltoall", "intra"): recorded(1.96),
                                                                           ("allreduce", "intra"): recorded(1.5)})}
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
    got = {(r["op"], r["link"]): r["verdict"] for r in attribution.step_ratios(STEPS, {("alltoall", "intra"): recorded(1.96),
                                                                                      ("allgather", "intra"): recorded(1.5)})}
    assert got == {("allgather", "inter"): "priced", ("allreduce", "inter"): "priced", ("allreduce", "intra"): "priced",
                   ("alltoall", "intra"): "slow_speed",      # 1.5x, recorded up to 1.96x
                   ("allgather", "intra"): "slower",         # 2x, past the recorded 1.5x and its 5%
                   ("reduce_scatter", "intra"): "slower"}    # 1.25x, no speed recorded
    v = attribution.verdict
    assert v(1.049, None) == "priced" and v(0.951, 1.5) == "priced" and v(0.94, 1.5) == "faster"
    assert v(1.09, 1.5) == "slower" and v(1.10, 1.5) == "slow_speed"     # a pricing error under the slow band
    assert v(1.5 * 1.05, 1.5) == "slow_speed" and v(1.5 * 1.06, 1.5) == "slower"
    text = attribution.describe({}, attribution.step_ratios(STEPS, {("alltoall", "intra"): recorded(1.96)}))
    assert "(up to 1.96x); at a slow speed the calibration records" in text
    assert "(1); slower than priced, at no speed the calibration records" in text


def test_a_launch_is_slow_only_where_every_collective_ran_slower_than_its_price():
    ratios = attribution.step_ratios(STEPS)
    assert not attribution.slow_launch(ratios) and not attribution.slow_launch([])       # some ran as priced
    slow = STEPS.assign(measured_s=STEPS["predicted_s"] * 2.5)
    assert attribution.slow_launch(attribution.step_ratios(slow))
    # a slow speed recorded (at whatever size) does not clear a launch that ran every collective slow
    assert attribution.slow_launch(attribution.step_ratios(slow, {("alltoall", "intra"): recorded(2.5)}))
    half = STEPS.assign(measured_s=STEPS["predicted_s"] * STEPS["op"].map({"allgather": 1.0}).fillna(2.5))
    assert not attribution.slow_launch(attribution.step_ratios(half, {("alltoall", "intra"): recorded(2.5)}))


def test_describe_names_every_link_and_collective():
    text = attribution.describe(attribution.link_accuracy(FRAME, STEPS, 0, 0), attribution.step_ratios(STEPS))
    assert "inter    0.9583  (2 strategies)" in text and "alltoall/intra" in text and "1.500 [1.250, 1.750] (2)" in text


def test_describe_is_empty_without_communication():
    only_compute = STEPS[STEPS["op"] == "compute"]
    assert attribution.step_ratios(only_compute) == []
    assert attribution.link_accuracy(FRAME[FRAME["comm_steps"] == 0], only_compute, 10, 0) == {}
    assert attribution.describe({}, []) == ""


def test_a_step_is_judged_by_the_speeds_its_sweep_saw_at_the_sizes_around_it():
    """Version 19 records the slow-over-price ratio at each size: the alltoall's steps (768 KiB and 1 MiB, 1.5x their
    price) are a recorded slow speed where the sweep saw one at the sizes around them (512 KiB to 1 MiB) and slower
    where the only slow speed it saw was an 8 B point's outlier (389x), which a calibration before 19 could not tell
    apart."""
    sizes = (8.0, 1024.0, 4096.0, 512 * 1024.0, 1 << 20, 4 << 20)
    outlier = recorded(389.0, sizes, (389.0, 1.0, 1.0, 1.0, 1.0, 1.0))
    near = recorded(389.0, sizes, (389.0, 1.0, 1.0, 1.96, 1.0, 1.0))
    got = {(r["op"], r["link"]): r for r in attribution.step_ratios(STEPS, {("alltoall", "intra"): outlier})}
    assert got[("alltoall", "intra")]["verdict"] == "slower" and "sweep_slow_ratio" not in got[("alltoall", "intra")]
    got = {(r["op"], r["link"]): r for r in attribution.step_ratios(STEPS, {("alltoall", "intra"): near})}
    assert got[("alltoall", "intra")]["verdict"] == "slow_speed" and got[("alltoall", "intra")]["sweep_slow_ratio"] == 1.96
    got = {(r["op"], r["link"]): r for r in attribution.step_ratios(STEPS, {("alltoall", "intra"): outlier[0:1] + near})}
    assert got[("alltoall", "intra")]["sweep_slow_ratio"] == 1.96         # the back-to-back and after-compute models
    old = recorded(389.0)[0]
    assert old.ratio_at(1e6, 1e6) == 389.0                                 # before 19: wherever it was seen
    s = near[0]
    assert s.ratio_at(2000, 3000) is None                                  # between 1 KiB and 4 KiB: one speed
    assert s.ratio_at(600_000, 600_000) == 1.96 and s.ratio_at(1 << 20, 1 << 20) is None      # a measured size: its own
    assert s.ratio_at(2 << 20, 2 << 20) is None and s.ratio_at(1e9, 1e9) is None       # past the largest size
    assert s.ratio_at(1, 1) == 389.0 and s.ratio_at(8, 8) == 389.0                    # at or below the smallest


def test_a_shared_link_step_is_judged_at_the_size_it_was_priced_at():
    """A step on a link that k groups share is priced at k times its bytes (steps' priced_bytes); its verdict reads
    the sweep's speeds there, not at its own size. An inter all-gather of 1 MiB that ran 1.5x its price, priced at
    2 MiB where the sweep saw a 1.8x slow speed, is a recorded slow speed; read at 1 MiB, where the sweep saw one
    speed, it would be slower."""
    sizes = (512 * 1024.0, 1 << 20, 2 << 20, 4 << 20)
    speeds = {("allgather", "inter"): recorded(1.8, sizes, (1.0, 1.0, 1.8, 1.0))}
    steps = pd.DataFrame([("L", "s1", "allgather", "inter", 1 << 20, 2 << 20, 0.010, 0.015)],
                         columns=["layer", "strategy", "op", "link", "size_bytes", "priced_bytes", "predicted_s",
                                  "measured_s"])
    (row,) = attribution.step_ratios(steps, speeds)
    assert row["verdict"] == "slow_speed" and row["sweep_slow_ratio"] == 1.8
    (row,) = attribution.step_ratios(steps.drop(columns="priced_bytes"), speeds)       # a table from before it
    assert row["verdict"] == "slower"
