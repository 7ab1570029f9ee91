"""Pure parts of the measurement engine: sizes, the median CI and stopping rule, bus factors,
layouts, link-class groups and the CPU steal arithmetic. No MPI needed."""

import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from microbench import memcopy, provenance
from microbench.buffers import Pool, address
from microbench.errors import UsageError
from microbench.ops import OPS, gemm_wrong, itemsize, parse_ops
from microbench.sizes import format_size, parse_size, parse_sizes
from microbench.stats import (SPEED_GAP, StopRule, estimate, median_ci_ranks, point_speeds,
                              pooled_estimate, round_spread, sample_until_done)
from microbench.topology import default_procs, group_for, groups_per_node, parse_links, parse_procs, tiles


@pytest.mark.parametrize("text,want", [("8", 8), ("1K", 1024), ("64M", 64 << 20), ("2G", 2 << 30), ("3m", 3 << 20),
                                       ("1.5K", 1536), ("4KiB", 4096), ("16B", 16)])
def test_parse_size(text, want):
    assert parse_size(text) == want


def test_parse_size_range_is_powers_of_two():
    assert parse_sizes("8:64M") == [2**k for k in range(3, 27)]
    assert parse_sizes("5:40") == [8, 16, 32]
    assert parse_sizes("8,1K,3M,1K") == [8, 1024, 3 << 20]
    assert parse_sizes("1K:4K,1448,2896,3M") == [1024, 1448, 2048, 2896, 4096, 3 << 20]


def test_the_default_sizes_are_powers_of_two_with_the_middles_between_1_and_64_KiB():
    """The sweep's default grid: every power of two from 8 B to 64 MiB, and between 1 and 64 KiB (where transports
    change protocol) the geometric middle of each octave, to 8 bytes; nothing else."""
    from microbench.sweep_cmd import DEFAULT_SIZES, PRESETS
    sizes = parse_sizes(PRESETS.defaults["sizes"])
    assert PRESETS.defaults["sizes"] == DEFAULT_SIZES
    powers = [2 ** k for k in range(3, 27)]
    middles = [s for s in sizes if s not in powers]
    assert set(powers) <= set(sizes) and len(middles) == 6
    for lo in (2 ** k for k in range(10, 16)):
        assert sum(lo < s < 2 * lo for s in middles) == 1
        assert any(abs(s - lo * 2 ** 0.5) <= 8 and s % 8 == 0 for s in middles), lo


@pytest.mark.parametrize("bad", ["", "abc", "8:", ":8", "1:2:3", "64M:8", "0", "-4", "1.3", "8,,x", "9:15",
                                 "8:64,", "8:1K:4K,2K", "9:15,1K"])
def test_malformed_sizes_raise(bad):
    with pytest.raises(UsageError):
        parse_sizes(bad)


@pytest.mark.parametrize("bad", ["1K:", ":1K", "8, :64"])
def test_a_range_missing_an_end_is_named_as_a_range(bad):
    with pytest.raises(UsageError, match="malformed size range"):
        parse_sizes(bad)


def test_format_size_round_trips_binary_units():
    for n in (8, 1024, 3 << 20, 64 << 20, 2 << 30):
        assert parse_size(format_size(n)) == n


@pytest.mark.parametrize("n,lo,hi", [(6, 1, 6), (10, 2, 9), (20, 6, 15), (100, 40, 61)])
def test_median_ci_ranks_match_binomial_tables(n, lo, hi):
    # 1-based order statistics of the distribution-free 95% CI of the median
    assert median_ci_ranks(n) == (lo - 1, hi - 1)


def test_median_ci_ranks_too_few_samples():
    assert median_ci_ranks(5) is None


@pytest.mark.parametrize("dist,true_median", [
    (lambda rng, n: rng.lognormal(mean=np.log(3e-6), sigma=0.5, size=n), 3e-6),
    (lambda rng, n: 1e-5 + rng.exponential(scale=2e-6, size=n), 1e-5 + 2e-6 * np.log(2)),
    (lambda rng, n: rng.uniform(1.0, 3.0, size=n), 2.0),
])
def test_median_ci_covers_known_median_at_least_95_percent(dist, true_median):
    rng = np.random.default_rng(42)
    trials, hits = 2000, 0
    for _ in range(trials):
        est = estimate(dist(rng, 37))
        hits += est.ci_low <= true_median <= est.ci_high
    assert hits / trials >= 0.94
    assert hits / trials <= 0.995   # exact order-statistic interval: not absurdly wide either


def test_stopping_rule_meets_target_on_tight_distribution():
    rng = np.random.default_rng(1)
    rule = StopRule(target_ci=0.02, min_samples=10, budget_s=100.0)
    samples = np.empty(0)
    while True:
        n = rule.next_batch(len(samples), 1e-6, 0.0)
        samples = np.append(samples, 5e-6 * (1 + 0.05 * rng.standard_normal(n)))
        est = estimate(samples)
        if rule.done(est, 0.0):
            break
    assert est.within(0.02)
    assert abs(est.median - 5e-6) / 5e-6 < 0.02
    assert len(samples) >= 10


def test_stopping_rule_budget_never_cuts_below_min_samples():
    rule = StopRule(target_ci=0.001, min_samples=10, budget_s=1.0)
    wide = estimate(np.random.default_rng(2).lognormal(0, 2, size=50))
    assert not wide.within(0.001)
    assert not rule.done(wide, 0.5)            # budget left, target missed: keep going
    assert rule.done(wide, 1.0)                # budget spent with enough samples
    stalled = estimate(np.array([1.26, 0.088]))  # one stalled iteration, one normal
    assert not rule.done(stalled, 2.0)
    assert not rule.done(stalled, 100.0)       # however long: a stall must not become the median


def test_next_batch_respects_remaining_budget():
    rule = StopRule(min_samples=10, budget_s=1.0)
    assert rule.next_batch(0, 0.0, 0.0) == 10
    assert rule.next_batch(100, 0.01, 0.5) == 50
    assert rule.next_batch(100, 0.01, 0.8) == 20
    assert rule.next_batch(100, 1.0, 2.0) == 1


@pytest.mark.parametrize("min_samples,rounds,per_visit", [(10, 3, 4), (6, 3, 2), (10, 1, 10), (6, 4, 2), (12, 4, 3)])
def test_a_visit_takes_its_share_of_budget_and_samples_and_the_visits_reach_the_minimum(min_samples, rounds, per_visit):
    rule = StopRule(target_ci=0.02, min_samples=min_samples, budget_s=1.5)
    v = rule.visit(rounds)
    assert (v.budget_s, v.min_samples, v.target_ci) == (pytest.approx(1.5 / rounds), per_visit, 0.02)
    assert v.min_samples * rounds >= min_samples


def test_round_spread_is_half_the_range_of_visit_medians_relative_to_the_pooled_median():
    visits = [np.array([1.0, 2.0, 3.0]), np.array([3.0, 4.0, 5.0]), np.array([2.0, 2.5, 9.0])]
    # medians 2, 4, 2.5; pooled median of 1,2,2,2.5,3,3,4,5,9 is 3
    assert round_spread(visits, pooled_estimate(visits).median) == pytest.approx((4 - 2) / 2 / 3)
    assert round_spread([np.array([1.0, 5.0, 7.0])], 5.0) == 0.0


def test_pooled_estimate_weighs_every_visit_the_same():
    """A long visit in a slow window must not set the median: 9 samples at 10 s against two visits of 3."""
    visits = [np.full(9, 10.0), np.array([1.0, 1.0, 1.0]), np.array([2.0, 2.0, 2.0])]
    est = pooled_estimate(visits)
    # weights 1/27 each for the slow visit, 1/9 for the others: cumulative 1/3 after the 1s, 2/3 after the 2s
    assert (est.samples, est.median, est.min, est.mean) == (15, 2.0, 1.0, pytest.approx(13 / 3))
    assert estimate(np.concatenate(visits)).median == 10.0      # what plain pooling would say
    assert est.ci_low <= est.median <= est.ci_high


def test_pooled_estimate_reduces_to_the_plain_estimate_for_one_visit_or_visits_of_equal_medians():
    rng = np.random.default_rng(3)
    one = rng.lognormal(size=41)
    assert pooled_estimate([one]) == estimate(one)
    equal = [rng.permutation(one[:20]) for _ in range(3)]
    got, want = pooled_estimate(equal), estimate(np.concatenate(equal))
    assert (got.median, got.ci_low, got.ci_high) == pytest.approx((want.median, want.ci_low, want.ci_high))


def test_a_point_is_priced_at_a_fast_speed_the_pooled_median_misses():
    """Calls at 1x and 1.9x a wire time: where each speed holds a quarter of the calls or more the price is the fast
    one's median (the pooled median lies on the slow one, or, the fast one holding most, above its middle) and the slow
    ratio the slow calls' median over it; where one side of the gap holds less than a quarter (outliers, not a speed),
    or the samples lie within SPEED_GAP of each other, the pooled median. Every visit weighs the same."""
    rng = np.random.default_rng(5)

    def calls(t, n):
        return t * (1 + 0.01 * rng.standard_normal(n))

    visits = [np.r_[calls(1.0, 4), calls(1.9, 6)] for _ in range(3)]
    sp = point_speeds(visits)[0]
    assert sp.median == pytest.approx(1.0, rel=0.02) and sp.share == pytest.approx(0.4)
    assert sp.slow_ratio == pytest.approx(1.9, rel=0.03)
    assert pooled_estimate(visits).median == pytest.approx(1.9, rel=0.02)
    # the fast speed holding most: the pooled median sits above its middle by the slow calls' share
    most = [np.r_[1.0 + 0.001 * np.arange(6), calls(1.9, 4)]]
    sp = point_speeds(most)[0]
    assert sp.median == pytest.approx(1.0025) and sp.share == pytest.approx(0.6)
    assert pooled_estimate(most).median == pytest.approx(1.0045) and sp.slow_ratio == pytest.approx(1.9, rel=0.03)
    # a visit of many fast samples weighs no more than one of few
    weighted = [np.r_[calls(1.0, 40)], calls(1.9, 5), calls(1.9, 5)]
    assert point_speeds(weighted)[0].median == pytest.approx(1.0, rel=0.02)
    for one in ([np.r_[calls(1.0, 8), calls(1.9, 2)]],            # a fifth slow: slow outliers, not a speed
                [np.r_[calls(1.0, 2), calls(1.9, 8)]],            # a fifth fast: fast outliers, not a speed
                [calls(1.0, 10) * np.linspace(1, 1 + SPEED_GAP, 10)]):  # one spread speed
        sp = point_speeds(one)[0]
        assert (sp.median, sp.share, sp.slow_ratio) == (pooled_estimate(one).median, 1.0, 1.0)
    assert math.isnan(point_speeds([])[0].median) and point_speeds([np.empty(0)])[0].share == 1.0


def test_point_speeds_finds_a_fast_minority_the_quarter_rule_leaves_out():
    """A tenth of the calls at 1x and the rest at 1.9x: the price stays the pooled median (a tenth is no speed by the
    quarter rule), the minority speed is the fast calls' median; one fast call is no minority, nor a twenty-fifth."""
    rng = np.random.default_rng(7)

    def calls(t, n):
        return t * (1 + 0.01 * rng.standard_normal(n))

    few = [np.r_[calls(1.0, 1), calls(1.9, 9)], np.r_[calls(1.0, 2), calls(1.9, 8)], calls(1.9, 10)]
    price, minority = point_speeds(few)
    assert price.median == pooled_estimate(few).median and price.share == 1.0
    assert minority.median == pytest.approx(1.0, rel=0.02) and minority.share == pytest.approx(0.1)
    assert minority.slow_ratio == pytest.approx(1.9, rel=0.03)
    for none in ([np.r_[calls(1.0, 1), calls(1.9, 9)]], [np.r_[calls(1.0, 2), calls(1.9, 48)]]):
        price, minority = point_speeds(none)
        assert minority == price
    quarter = [np.r_[calls(1.0, 4), calls(1.9, 6)]]
    price, minority = point_speeds(quarter)
    assert minority == price and price.share == pytest.approx(0.4)


def test_pooled_ci_covers_the_drift_between_visits_that_the_pooled_samples_hide():
    """Three windows at 0.8, 1.0 and 1.2 s, each steady to 0.1%: the order-statistic CI of the 90 samples is
    the middle window's +-0.1%, the visits' medians say +-1.96 * 0.2 / sqrt(3) = +-23%, which reaches past the
    samples: the interval stops at the fastest and slowest sample. Six windows from 0.8 to 1.2 s say
    +-1.96 * 0.141 / sqrt(6) = +-11%, which fits."""
    rng = np.random.default_rng(5)
    jitter = 1 + 1e-3 * rng.uniform(-1, 1, 30)
    visits = [level * jitter for level in (0.8, 1.0, 1.2)]
    plain = estimate(np.concatenate(visits))
    assert plain.ci_high - plain.ci_low < 0.002
    got = pooled_estimate(visits)
    assert got.median == pytest.approx(1.0, abs=1e-3)
    assert (got.ci_low, got.ci_high) == (visits[0].min(), visits[2].max())
    assert not got.within(0.2) and got.within(0.25)
    levels = (0.8, 0.9, 1.0, 1.0, 1.1, 1.2)
    got = pooled_estimate([level * jitter for level in levels])
    half = 1.959964 * np.std(levels, ddof=1) / np.sqrt(len(levels))
    assert (got.ci_low, got.ci_high) == pytest.approx((got.median - half, got.median + half), rel=1e-3)


@pytest.mark.parametrize("p", [2, 3, 4, 8, 64])
def test_bus_factors_follow_nccl_tests(p):
    assert OPS["allreduce"].bus_factor(p) == pytest.approx(2 * (p - 1) / p)
    for name in ("allgather", "reduce_scatter", "alltoall"):
        assert OPS[name].bus_factor(p) == pytest.approx((p - 1) / p)
    for name in ("bcast", "reduce", "pingpong", "sendrecv"):
        assert OPS[name].bus_factor(p) == 1.0


def test_layouts_keep_whole_blocks_and_nccl_size_meaning():
    f4 = itemsize("float32")
    ag = OPS["allgather"].layout(1000, 4, f4)
    assert (ag.send_count, ag.recv_count, ag.size_bytes) == (62, 248, 992)
    rs = OPS["reduce_scatter"].layout(1000, 4, f4)
    assert (rs.send_count, rs.recv_count, rs.size_bytes) == (248, 62, 992)
    a2a = OPS["alltoall"].layout(8, 4, f4)          # too small to split: one element per block
    assert (a2a.send_count, a2a.recv_count, a2a.size_bytes) == (4, 4, 16)
    ar = OPS["allreduce"].layout(64 << 20, 8, f4)
    assert ar.size_bytes == 64 << 20 and ar.send_count == 16 << 20
    assert OPS["allreduce"].bytes_per_rank(ar.size_bytes, 8) == pytest.approx(2 * 7 / 8 * (64 << 20))


def test_local_operand_sides_round_down_to_multiples_of_64():
    f2, f4 = itemsize("float16"), itemsize("float32")
    assert OPS["gemm"].layout(256 << 20, 1, f2).block == 11584          # sqrt(128M) = 11585.2
    assert OPS["gemm"].layout(16 << 20, 1, f4).block == 2048
    assert OPS["gemm"].layout(64 << 10, 1, f4).block == 128
    assert OPS["gemm"].layout(1000, 1, f4).block == 14                  # under 64: even (copy halves it)


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_gemm_check_accepts_rounding_and_catches_a_misplaced_term(dtype):
    rng = np.random.default_rng(1)
    n = 512
    a = rng.standard_normal((8, n)).astype(dtype).astype(np.float64)
    b = rng.standard_normal((n, 8)).astype(dtype).astype(np.float64)
    acc = np.float64 if dtype == "float64" else np.float32
    exact = np.einsum("ij,ji->i", a, b)
    computed = np.einsum("ij,ji->i", a.astype(acc), b.astype(acc)).astype(dtype).astype(np.float64)
    assert gemm_wrong(a, b, computed, n, dtype) == 0
    assert gemm_wrong(a, b, exact, n, dtype) == 0
    shifted = np.einsum("ij,ji->i", a, np.roll(b, 1, axis=0))           # one row of b off by one
    assert gemm_wrong(a, b, shifted, n, dtype) == 8
    zeros = np.zeros(8)
    assert gemm_wrong(a, b, zeros, n, dtype) == 8
    nan = computed.copy()
    nan[0] = np.nan
    assert gemm_wrong(a, b, nan, n, dtype) == 1


def test_expected_results_are_consistent_across_ranks():
    """Simulate each collective with numpy from every rank's send buffer; it must equal `expected`."""
    p, lay = 4, OPS["alltoall"].layout(64, 4, 4)
    sends = [OPS["alltoall"].fill(np, lay, "float32", r, p)[0] for r in range(p)]
    for r in range(p):
        got = np.concatenate([sends[q][r * lay.block:(r + 1) * lay.block] for q in range(p)])
        assert np.array_equal(got, OPS["alltoall"].expected(np, lay, "float32", r, p))
    lay = OPS["reduce_scatter"].layout(64, 4, 4)
    total = sum(OPS["reduce_scatter"].fill(np, lay, "float32", r, p)[0] for r in range(p))
    for r in range(p):
        assert np.array_equal(total[r * lay.block:(r + 1) * lay.block],
                              OPS["reduce_scatter"].expected(np, lay, "float32", r, p))


def test_parse_ops():
    assert [op.name for op in parse_ops("pingpong,allreduce")] == ["allreduce", "pingpong"]
    assert len(parse_ops(None)) == len(OPS)
    with pytest.raises(UsageError, match="unknown operation 'bogus'"):
        parse_ops("allreduce,bogus")


@pytest.mark.parametrize("parse,text,says", [
    (parse_ops, "", "empty operation"), (parse_ops, "allreduce,,pingpong", "empty operation"),
    (lambda t: parse_procs(t, 4), "", "malformed process counts"),
    (lambda t: parse_procs(t, 4), "2,,4", "malformed process counts"),
    (parse_links, "", "unknown link class ''"), (parse_links, "intra,", "unknown link class ''")])
def test_an_empty_list_or_item_is_an_error_not_every_value(parse, text, says):
    """An unset shell variable (--ops "$OPS") must not sweep everything: only an absent option means all."""
    with pytest.raises(UsageError, match=says):
        parse(text)


def test_link_groups_from_hosts():
    hosts = ["a", "a", "b", "b"]                     # 2 nodes x 2 ranks, block layout
    assert group_for("intra", 2, hosts).ranks == (0, 1)
    assert group_for("intra", 4, hosts) is None
    inter = group_for("inter", 2, hosts)
    assert inter.ranks == (0, 2) and (inter.nodes, inter.ranks_per_node) == (2, 1)
    spread = group_for("spread", 4, hosts)
    assert spread.ranks == (0, 1, 2, 3) and (spread.nodes, spread.ranks_per_node) == (2, 2)
    assert group_for("spread", 2, hosts) is None
    cyclic = ["a", "b", "a", "b"]                    # round-robin layout
    assert group_for("intra", 2, cyclic).ranks == (0, 2)
    assert group_for("inter", 2, cyclic).ranks == (0, 1)
    assert group_for("inter", 2, ["a", "a"]) is None


def test_concurrent_tiles_are_disjoint_groups_of_one_shape():
    hosts = ["a", "a", "b", "b"]
    ranks = lambda link, p, h: [g.ranks for g in tiles(link, p, h)]  # noqa: E731
    assert ranks("intra", 2, hosts) == [(0, 1), (2, 3)]          # one per node
    assert ranks("inter", 2, hosts) == [(0, 2), (1, 3)]          # one per lane: both share each node's link
    assert ranks("spread", 4, hosts) == [(0, 1, 2, 3)]
    assert groups_per_node(tiles("inter", 2, hosts), hosts) == 2
    assert groups_per_node(tiles("intra", 2, hosts), hosts) == 1
    three = ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    assert ranks("inter", 2, three) == [(0, 3), (1, 4), (2, 5)]  # node c left idle: no partner
    assert ranks("intra", 2, three) == [(0, 1), (3, 4), (6, 7)]  # one rank per node left idle
    assert ranks("inter", 3, three) == [(0, 3, 6), (1, 4, 7), (2, 5, 8)]
    for link, p in (("intra", 2), ("inter", 2), ("inter", 3), ("spread", 6)):
        got = tiles(link, p, three)
        assert got[0] == group_for(link, p, three)
        flat = [r for g in got for r in g.ranks]
        assert len(flat) == len(set(flat)) and all(len(g.ranks) == p for g in got)
    assert tiles("intra", 4, hosts) == ()


def test_process_counts_and_links():
    assert default_procs(8) == [2, 4, 8]
    assert default_procs(6) == [2, 4, 6]
    assert parse_procs("4,2", 4) == [2, 4]
    with pytest.raises(UsageError, match="larger than the world"):
        parse_procs("2,8", 4)
    with pytest.raises(UsageError):
        parse_procs("2,x", 4)
    assert parse_links("inter,intra") == ["intra", "inter"]
    with pytest.raises(UsageError):
        parse_links("intra,wan")


def test_pure_modules_do_not_import_mpi4py_or_cupy():
    code = ("import sys; import microbench.ops, microbench.records, microbench.stats, microbench.sizes, "
            "microbench.topology, microbench.store, reports.cli; "
            "bad = [m for m in ('mpi4py', 'cupy') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_steal_is_the_steal_counters_share_of_all_cpu_time_between_two_readings():
    before = (100, 5, 50, 800, 10, 1, 4, 30)
    after = (200, 5, 70, 880, 10, 1, 4, 50)       # 100 + 20 + 80 + 20 ticks pass, 20 of them stolen
    assert provenance.steal_fraction(before, after) == pytest.approx(20 / 220)
    assert provenance.steal_fraction(before, before) is None            # no time passed
    assert provenance.steal_fraction(None, after) is None and provenance.steal_fraction(before, None) is None
    assert provenance.steal_text({"a": 20 / 220, "b": None}) == "a 9.1%, b unknown"


def test_cpu_counters_are_this_hosts_eight_tick_counters_and_only_grow():
    first = provenance.cpu_counters()
    if first is None:
        pytest.skip("this kernel has no /proc/stat cpu line")
    time.sleep(0.1)
    second = provenance.cpu_counters()
    assert len(first) == 8 and all(b >= a >= 0 for a, b in zip(first, second))
    assert sum(second) > sum(first)
    assert 0 <= provenance.steal_fraction(first, second) <= 1


def test_cpu_quota_is_the_tightest_quota_over_the_cgroup_and_its_ancestors(tmp_path):
    """cgroup v2's cpu.max and v1's cfs quota over period, read along the process's cgroup path up to the mount's root,
    each cgroup named by its path and inode; "max", -1, an unreadable or malformed file and a controller line without
    cpu set no quota."""
    def write(path, **files):
        path.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (path / name.replace("_", ".", 1)).write_text(text)

    write(tmp_path / "v2" / "slurm" / "job7", cpu_max="max 100000\n")
    write(tmp_path / "v2" / "slurm", cpu_max="250000 100000\n")
    def key(path, label):
        st = path.stat()
        return f"{label}@{st.st_dev}:{st.st_ino}"

    assert provenance.cpu_quota("0::/slurm/job7\n", tmp_path / "v2") == (key(tmp_path / "v2" / "slurm", "v2:/slurm"), 2.5)
    write(tmp_path / "v2" / "slurm" / "job7", cpu_max="150000 100000\n")
    assert provenance.cpu_quota("0::/slurm/job7\n", tmp_path / "v2") == (
        key(tmp_path / "v2" / "slurm" / "job7", "v2:/slurm/job7"), 1.5)
    assert provenance.cpu_quota("0::/elsewhere\n", tmp_path / "v2") is None        # no file on the path: none
    v1 = tmp_path / "v1" / "cpu,cpuacct"
    write(v1 / "docker" / "c1", **{"cpu_cfs_quota_us": "50000\n", "cpu_cfs_period_us": "100000\n"})
    text = "12:memory:/docker/c1\n4:cpu,cpuacct:/docker/c1\n0::/\n"
    assert provenance.cpu_quota(text, tmp_path / "v1") == (key(v1 / "docker" / "c1", "cpu,cpuacct:/docker/c1"), 0.5)
    write(tmp_path / "ns", cpu_max="100000 100000\n")             # two containers, each its cgroup seen as "/"
    write(tmp_path / "ns2", cpu_max="100000 100000\n")
    one, other = provenance.cpu_quota("0::/\n", tmp_path / "ns"), provenance.cpu_quota("0::/\n", tmp_path / "ns2")
    assert one[0] != other[0] and provenance.machine_sharing([("a", [0, 1], one), ("a", [0, 1], other)]) is None
    write(v1 / "docker" / "c1", **{"cpu_cfs_quota_us": "-1\n"})
    assert provenance.cpu_quota(text, tmp_path / "v1") is None
    for bad in ("", "garbage", "0 0", "100000 0"):
        write(tmp_path / "v2" / "slurm" / "job7", cpu_max=bad)
        write(tmp_path / "v2" / "slurm", cpu_max=bad)
        assert provenance.cpu_quota("0::/slurm/job7\n", tmp_path / "v2") is None, bad
    assert provenance.cpu_quota("not a cgroup line\n1:memory:/x\n", tmp_path / "v2") is None


def test_machine_sharing_counts_each_machines_ranks_against_its_affinities_and_quotas():
    """Per kernel, the ranks against the union of their affinities, or the sum of their distinct cgroups' quotas
    where every rank has one; the machine whose ranks most outnumber its CPUs is the one reported."""
    assert provenance.machine_sharing([("a", [0, 1], None)] * 4) == {"ranks": 4, "cpus": 2}
    assert provenance.machine_sharing([("a", [0], None), ("a", [1], None), ("b", [0, 1], None)]) is None
    assert provenance.machine_sharing([("a", [0, 1, 2, 3], ("v2:/job", 1.5))] * 2) == {"ranks": 2, "cpus": 1}
    two_jobs = [("a", [0, 1, 2, 3], ("v2:/j1", 1.0)), ("a", [0, 1, 2, 3], ("v2:/j2", 1.0))]
    assert provenance.machine_sharing(two_jobs) is None                          # a CPU's quota each
    assert provenance.machine_sharing([("a", [0, 1], ("v2:/job", 8.0))] * 3) == {"ranks": 3, "cpus": 2}
    assert provenance.machine_sharing([("a", [0, 1], ("v2:/job", 1.0)), ("a", [0, 1], None)]) is None
    assert provenance.machine_sharing([("a", [0, 1, 2], None)] * 4 + [("b", [0, 1], ("v2:/j", 0.5))]) == {
        "ranks": 4, "cpus": 3}                                                   # one rank under half a CPU shares none
    assert provenance.machine_sharing([("a", [0, 1, 2, 3], ("v2:/job", 2.5))] * 3) == {"ranks": 3, "cpus": 2}
    assert provenance.machine_sharing([("a", [0, 1, 2, 3], ("v2:/job", 2.5))] * 2) is None


def test_cold_slots_are_page_aligned_copies_of_the_pair_filling_the_pool():
    pool = Pool(np, 64 * 4096)
    send, recv = np.arange(1500, dtype=np.float32), np.full(3000, 7.0, dtype=np.float32)
    slots = pool.slots(send, recv)
    assert slots.count == 64 // 5 and slots.stride == 5 * 4096     # 6000 + 12000 bytes round up to 5 pages
    for i in (0, 5, slots.count - 1, slots.count + 2):
        s, r = slots.pair(i)
        assert address(s) % 4096 == 0 and address(s) - address(slots.send) == (i % slots.count) * slots.stride
        assert address(r) - address(s) == 6016                        # recv after send, 64-byte aligned
        assert (s == send).all() and (r == recv).all() and s.shape == send.shape
    outer = np.zeros(40, dtype=np.float64)
    inner = outer[8:18]
    inner[:] = 3.0
    s, r = pool.slots(inner, outer, in_place=True).pair(3)           # in place: send stays inside recv
    assert address(s) - address(r) == 64 and (r[8:18] == 3.0).all() and r[7] == 0.0
    big = np.ones(20 * 4096, dtype=np.float32)                       # two copies would not fit: the pair itself
    one = pool.slots(big, big.copy())
    assert one.count == 1 and one.pair(5)[0] is big


def test_sampling_runs_batches_until_the_rule_judges_the_totals_done():
    """Rows of two items whose totals are tight stop at min_samples; a loose total runs out the budget."""
    calls = []

    def batch(iters):
        calls.append(iters)
        rows = np.column_stack([np.full(iters, 1e-3), np.linspace(0, 1e-3, iters) if wide else np.full(iters, 1e-3)])
        return rows, iters * 0.01

    rule = StopRule(target_ci=0.02, min_samples=10, budget_s=1.0)
    wide = False
    rows = sample_until_done(batch, rule, 0.01, lambda r: r.sum(axis=1))
    assert rows.shape == (10, 2) and calls == [10]
    calls.clear()
    wide = True
    rows = sample_until_done(batch, rule, 0.01, lambda r: r.sum(axis=1))
    assert len(rows) == sum(calls) and sum(calls) * 0.01 >= rule.budget_s and calls[0] == 10


FAULTS = """
import resource, sys
import numpy as np
from microbench.buffers import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
def step():                      # two 1 MiB arrays alive at once, then both freed, as a layer's steps do
    a = np.ones(1 << 18, dtype=np.float32)
    return float((a * 2)[-1])
for _ in range(5):
    step()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(kept, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 20)
"""


def test_keep_freed_memory_spares_new_arrays_their_page_faults():
    """glibc by default gives the freed 2 MiB back and faults ~480 pages in again on every step; with the memory
    kept, the arrays land on pages already mapped."""
    got = {mode: subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True,
                                cwd=Path(__file__).parents[1]).stdout.split() for mode in ("keep", "system")}
    assert got["keep"][0] == "True" and float(got["keep"][1]) < 8
    assert float(got["system"][1]) > 200


def test_memcopy_reports_the_placement_slowdown_and_the_glibc_tunable_removes_it():
    """With memcpy kept off REP MOVSB, a copy 16 B past its source (mod 4 KiB) runs about as fast as one 2 KiB past;
    the table covers every size and offset, and the advice names the tunable only above the threshold."""
    env = dict(os.environ, GLIBC_TUNABLES=memcopy.TUNABLE)
    proc = subprocess.run([sys.executable, "-m", "microbench.memcopy"], env=env, capture_output=True, text=True,
                          cwd=Path(__file__).parents[1], timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"GLIBC_TUNABLES={memcopy.TUNABLE}"
    rows = [ln.split() for ln in lines[2:7]]
    assert [r[0] for r in rows] == ["4Ki", "32Ki", "128Ki", "512Ki", "2048Ki"]
    assert all(len(r) == 7 and all(float(x) > 0 for x in r[1:]) for r in rows)
    slowdown = float(re.search(r"16 B against 2048 B: ([\d.]+)x", proc.stdout).group(1))
    assert 0 < slowdown < memcopy.WARN_SLOWDOWN and lines[-1] == "no placement penalty worth a warning"
    assert memcopy.advice(1.9) is None and f"GLIBC_TUNABLES={memcopy.TUNABLE}" in memcopy.advice(13.0)


def test_memcopy_drift_prints_each_process_rates_over_time_and_refuses_bad_durations():
    """--drift 3 --procs 2: one line per process with a positive median inside its 5th-95th percentiles and one
    window; a duration that is not a positive finite number exits 2 with one line."""
    run = lambda *a: subprocess.run([sys.executable, "-m", "microbench.memcopy", *a], capture_output=True,  # noqa: E731
                                    text=True, cwd=Path(__file__).parents[1], timeout=60)
    proc = run("--drift", "3", "--procs", "2")
    assert proc.returncode == 0, proc.stderr
    found = re.findall(r"^process (\d): median ([\d.]+)  p5 ([\d.]+)  p95 ([\d.]+)  windows ([\d.]+)  \(", proc.stdout,
                       re.M)
    assert [f[0] for f in found] == ["0", "1"]
    for _, med, p5, p95, window in found:
        assert 0 < float(p5) <= float(med) <= float(p95) and float(window) > 0
    for bad in ("0", "-2", "inf", "nan"):
        proc = run("--drift", bad)
        assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "--drift" in proc.stderr
