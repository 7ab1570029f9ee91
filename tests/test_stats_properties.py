"""Property tests of microbench.stats: whatever visits a point pools (one or several, few samples or many, ties,
outliers, tiny or huge values), its CI lies within the samples' range and contains the median, or is NaN on both
sides; one visit pooled is exactly the plain estimate; and a point's price (point_speeds) is its pooled median or a
faster speed among its samples, never outside them."""

from __future__ import annotations

import math
from dataclasses import astuple

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from microbench.stats import (MINORITY_SHARE, SPEED_GAP, SPEED_SHARE, StopRule, estimate,
                              point_speeds, pooled_estimate)

ANY_FINITE = st.floats(allow_nan=False, allow_infinity=False)
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")   # means and spreads of ~1e308


@st.composite
def timings(draw) -> list[float]:
    """One visit's samples around a level anywhere from 1e-300 to 1e300 s: jitter, exact ties and outliers up to
    a million times slower (a disturbed window)."""
    level = draw(st.floats(min_value=1e-300, max_value=1e300))
    value = st.one_of(st.just(level), st.floats(min_value=level * 0.5, max_value=level * 2),
                      st.floats(min_value=level * 1e3, max_value=level * 1e6))
    return draw(st.lists(value, min_size=1, max_size=50))


VISIT = st.one_of(timings(), st.lists(ANY_FINITE, min_size=1, max_size=50))
VISITS = st.lists(VISIT, min_size=1, max_size=6)


def check_interval(est, samples: np.ndarray) -> None:
    """The rule: a CI is two numbers min <= lo <= median <= hi <= max, or NaN on both sides and never met."""
    assert est.samples == len(samples)
    assert est.min == samples.min() and est.min <= est.median <= samples.max()
    if math.isnan(est.ci_low) or math.isnan(est.ci_high):
        assert math.isnan(est.ci_low) and math.isnan(est.ci_high)
        assert not est.within(1e300) and not StopRule(min_samples=1).met(est)
        return
    assert samples.min() <= est.ci_low <= est.median <= est.ci_high <= samples.max()


@settings(max_examples=400, deadline=None)
@given(VISITS)
@example([[17.7e-6] * 20, [17.6e-6] * 20, [5e-3] * 20])   # one visit in a disturbed window
@example([[1e-6] * 6, [1e-3] * 6])
@example([[1.7e308, 1.7e308], [1.7e308] * 5])             # midpoints that would overflow
def test_pooled_ci_lies_within_the_samples_and_contains_the_median(visits):
    arrays = [np.asarray(v, dtype=float) for v in visits]
    check_interval(pooled_estimate(arrays), np.concatenate(arrays))


@settings(max_examples=300, deadline=None)
@given(VISIT)
@example([1.7e308, 1.7e308])
def test_one_visit_pooled_is_the_plain_estimate_and_obeys_the_rule(visit):
    x = np.asarray(visit, dtype=float)
    plain = estimate(x)
    np.testing.assert_equal(astuple(pooled_estimate([x])), astuple(plain))   # NaN equals NaN here
    np.testing.assert_equal(astuple(pooled_estimate([x, np.empty(0)])), astuple(plain))
    check_interval(plain, x)


def test_no_samples_is_no_estimate_and_never_meets_a_target():
    for est in (estimate(np.empty(0)), pooled_estimate([]), pooled_estimate([np.empty(0), np.empty(0)])):
        assert est.samples == 0 and all(math.isnan(v) for v in astuple(est)[1:])
        assert not est.within(1.0) and not StopRule(min_samples=0).met(est)


@settings(max_examples=400, deadline=None)
@given(st.lists(timings(), min_size=1, max_size=6))
@example([[1.0] * 4 + [1.9] * 6] * 3)
@example([[1.0], [1.0], [1.0], [2.0] * 6])
@example([[1.7e308, 1.7e308], [1.7e308] * 5])
def test_a_price_is_the_pooled_median_or_a_faster_speed_within_the_samples(visits):
    arrays = [np.asarray(v, dtype=float) for v in visits]
    samples, pooled = np.concatenate(arrays), pooled_estimate(arrays).median
    speed, minority = point_speeds(arrays)
    assert samples.min() <= speed.median <= pooled <= samples.max()
    assert 0.25 <= speed.share <= 1.0
    if speed.share == 1.0:
        assert speed.median == pooled and speed.slow_ratio == 1.0
    else:
        assert 0.25 <= speed.share <= 0.75 + 1e-9 and speed.slow_ratio > 1 + SPEED_GAP   # both sides a speed
    assert samples.min() <= minority.median <= speed.median
    if minority != speed:   # a faster minority: a twentieth and two calls below a gap, a quarter above it
        assert MINORITY_SHARE <= minority.share <= 1 - SPEED_SHARE + 1e-9 and minority.slow_ratio > 1 + SPEED_GAP
