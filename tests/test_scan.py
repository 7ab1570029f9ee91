"""`commcal scan` without a cluster: the round-robin schedule, the slow-node rule on synthetic machines, the scan
file and its readers (report, diff) on good and damaged directories, the scale planner and both --dry-runs, and
one real 3-rank scan on this host."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, replace
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import REPO, mpi_env, mpiexec_argv, run_main, run_mpi
from microbench import plan
from microbench.outliers import Rule, better_median, judge_pairs
from microbench.scanfile import ScanRow, merge_rechecks, read_scan, write_scan
from microbench.schedule import round_count, round_robin
from microbench.stats import StopRule


@pytest.mark.parametrize("n", range(0, 41))
def test_round_robin_meets_every_pair_once_in_disjoint_rounds(n):
    rounds = round_robin(n)
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == list(combinations(range(n), 2))
    assert len(rounds) == round_count(n) == (0 if n < 2 else n - 1 + n % 2)
    for r in rounds:
        members = [x for p in r for x in p]
        assert len(members) == len(set(members)) and len(r) == n // 2


def test_better_median_takes_the_better_middle_value_of_an_even_count():
    assert better_median([1, 5, 9, 2], True) == 5 and better_median([1, 5, 9, 2], False) == 2
    assert better_median([3, 1, 2], True) == 2 and np.isnan(better_median([float("nan")], True))


def machine(n: int, seed: int, slow_nodes=(), slow_pairs=(), factor=0.55, noise=0.03):
    """Pair bandwidths of n nodes (names n0..): 1.0 with +-noise, a slow node's pairs and a slow pair at factor."""
    rng = np.random.default_rng(seed)
    names = [f"n{i}" for i in range(n)]
    out = {}
    for a, b in combinations(names, 2):
        v = 1.0 + rng.uniform(-noise, noise)
        out[(a, b)] = v * (factor if a in slow_nodes or b in slow_nodes or (a, b) in slow_pairs else 1.0)
    return names, out


@pytest.mark.parametrize("n", [3, 4, 5, 8, 16, 64])
@pytest.mark.parametrize("seed", range(5))
def test_the_rule_names_a_planted_slow_node_and_only_it(n, seed):
    names, clean = machine(n, seed)
    v = judge_pairs("bandwidth", clean, True, Rule(0.10), names)
    assert v.slow_nodes == () and v.slow_pairs == ()
    slow = names[seed % n]
    names, pairs = machine(n, seed, slow_nodes=(slow,))
    v = judge_pairs("bandwidth", pairs, True, Rule(0.10), names)
    assert v.slow_nodes == (slow,)
    assert sorted(v.slow_pairs) == sorted(p for p in pairs if slow in p)
    # latency: lower is better, the slow node's pairs take twice as long
    lat = {p: 1 / x if slow not in p else 2 / x for p, x in clean.items()}
    assert judge_pairs("latency", lat, False, Rule(0.5), names).slow_nodes == (slow,)


def test_a_slow_link_between_healthy_nodes_flags_the_pair_not_its_nodes():
    names, pairs = machine(8, 1, slow_pairs=(("n2", "n5"),))
    v = judge_pairs("bandwidth", pairs, True, Rule(0.10), names)
    assert v.slow_nodes == () and v.slow_pairs == (("n2", "n5"),)


def test_the_rule_holds_while_slow_nodes_are_a_minority():
    names, pairs = machine(16, 2, slow_nodes=("n3", "n11", "n12"))
    assert judge_pairs("bandwidth", pairs, True, Rule(0.10), names).slow_nodes == ("n3", "n11", "n12")


def scan_dir(path: Path, slow: str | None = None, n: int = 4) -> Path:
    """A scan directory as `commcal scan` writes it, of n nodes; `slow`'s pairs at half the bandwidth."""
    nodes = [f"node{i + 1}" for i in range(n)]
    rows = []
    for rnd, pairs in enumerate(round_robin(n)):
        for a, b in pairs:
            a, b = nodes[a], nodes[b]
            f = 0.5 if slow in (a, b) else 1.0
            rows.append(ScanRow("pair", a, b, rnd, "pingpong", 8, 100, 20e-6, 19e-6, 21e-6, True, 8 / 20e-6, 0))
            t = (4 << 20) / (47.8e6 * f)
            rows.append(ScanRow("pair", a, b, rnd, "pingpong", 4 << 20, 12, t, t * 0.99, t * 1.01, True,
                                (4 << 20) / t, 0))
    for node in nodes:
        rows.append(ScanRow("node", node, "", -1, "copy", 16 << 20, 50, 1e-3, 0.99e-3, 1.01e-3, True, 32e9, 0))
        rows.append(ScanRow("node", node, "", -1, "gemm", 1 << 20, 50, 2e-3, 1.99e-3, 2.01e-3, True, 130e9, 0))
    meta = {"schema": "commcal.scan", "version": 1, "nodes": nodes, "options": {"bandwidth_tolerance": 0.1}}
    write_scan(path, meta, rows)
    return path


def test_a_scan_file_reads_back_with_its_slow_node(tmp_path):
    scan = read_scan(scan_dir(tmp_path / "s", slow="node3"))
    assert scan.flagged_nodes() == {"node3": ["bandwidth"]}
    assert scan.latency_size == 8 and scan.bandwidth_size == 4 << 20
    assert abs(scan.pair_values(4 << 20, "rate")[("node1", "node2")] / 47.8e6 - 1) < 1e-9


def test_a_recheck_keeps_the_faster_figure_and_a_lasting_fault_stays_flagged(tmp_path, capsys):
    first = read_scan(scan_dir(tmp_path / "s", slow="node3"))
    suspects = first.suspects()
    assert set(suspects.pairs) == {p for p in zip(first.pairs["node_a"], first.pairs["node_b"]) if "node3" in p}
    assert len(suspects.pairs) == 3 and not suspects.nodes
    rows = [ScanRow(**r) for r in first.rows.to_dict("records")]
    slow_pair, passing = suspects.pairs[0], suspects.pairs[1]
    again = []
    for r in rows:
        if r.kind == "pair" and (r.node_a, r.node_b) == passing and r.size_bytes == 8:
            again.append(replace(r, median_s=r.median_s * 3, wrong=1))        # disturbed the second time
        elif r.kind == "pair" and (r.node_a, r.node_b) == passing:
            again.append(replace(r, median_s=r.median_s / 2, rate=r.rate * 2))  # healthy the second time
        elif r.kind == "pair" and (r.node_a, r.node_b) == slow_pair:
            again.append(replace(r, median_s=r.median_s * 1.01, rate=r.rate / 1.01))
    kept, record = merge_rechecks(rows, again)
    assert len(kept) == len(rows) and len(record) == len(again)
    by = {(r.node_a, r.node_b, r.size_bytes): r for r in kept if r.kind == "pair"}
    assert by[(*passing, 8)].median_s == 20e-6 and by[(*passing, 8)].wrong == 1, "the faster, with both wrongs"
    assert by[(*passing, 4 << 20)].rate == pytest.approx(47.8e6)
    assert by[(*slow_pair, 4 << 20)].rate == pytest.approx(47.8e6 / 2), "a lasting fault keeps its first figure"
    assert [r.kept_second for r in record].count(True) == 1
    meta = dict(first.meta, rechecked=[asdict(r) for r in record] + [{"op": "x"}, 3, {**asdict(record[0]), "kept_second": "false"}])
    write_scan(tmp_path / "t", meta, kept)
    second = read_scan(tmp_path / "t")
    assert second.rechecks == tuple(record), "ill-formed entries are left out"
    assert second.flagged_nodes() == {"node3": ["bandwidth"]}
    assert sorted(second.suspects().pairs) == sorted(p for p in suspects.pairs if p != passing)
    code, _, err = run_main(capsys, ["report", "--run", str(tmp_path / "t"), "--out", str(tmp_path / "r")])
    assert code == 0, err
    assert "Measured twice" in (tmp_path / "r" / "report.md").read_text()


def test_report_and_diff_of_scans(tmp_path, capsys):
    clean, slow = scan_dir(tmp_path / "a"), scan_dir(tmp_path / "b", slow="node2")
    code, out, err = run_main(capsys, ["report", "--run", str(slow), "--out", str(tmp_path / "r")])
    assert code == 0, err
    html = (tmp_path / "r" / "report.html").read_text()
    assert "Slow nodes: node2 (bandwidth)" in html and "scan-pairs" in (tmp_path / "r" / "report.md").read_text()
    code, out, err = run_main(capsys, ["diff", str(clean), str(slow), "--check", "--out", str(tmp_path / "d")])
    assert code == 1 and "newly slow nodes: node2" in out, out + err
    assert "node1–node2  bandwidth" in out and " 0.500" in out
    code, out, _ = run_main(capsys, ["diff", str(clean), str(clean), "--check"])
    assert code == 0 and "newly slow nodes: none" in out
    code, _, err = run_main(capsys, ["diff", str(clean), str(tmp_path / "nothing.json")])
    assert code == 2 and "cannot compare a scan with a calibration" in err
    code, _, err = run_main(capsys, ["fit", str(clean), "--out", str(tmp_path / "c.json")])
    assert code == 2 and "no run.json): a scan directory" in err, err
    code, _, err = run_main(capsys, ["table", str(clean)])
    assert code == 2 and "a scan directory, not a calibration" in err, err


@pytest.mark.parametrize("value", [float("nan"), 0.0, -5.0, float("inf"), "no row"])
@pytest.mark.parametrize("figure", ["bandwidth", "copy"])
def test_a_figure_that_is_not_a_positive_number_is_not_judged_and_fails_the_check(tmp_path, capsys, value, figure):
    """A pair or node figure that is missing or not a positive number: listed as not judged, slows no node, shown
    in the report, and fails diff --check when the later scan has it (not the earlier)."""
    good, bad = scan_dir(tmp_path / "good"), scan_dir(tmp_path / "bad")
    rows = pd.read_parquet(bad / "scan.parquet")
    where = (rows["size_bytes"] == 4 << 20) if figure == "bandwidth" else (rows["op"] == "copy")
    i = rows.index[where][0]
    named = f"{rows.loc[i, 'node_a']}–{rows.loc[i, 'node_b']}" if figure == "bandwidth" else rows.loc[i, "node_a"]
    if value == "no row":
        rows.drop(index=i).to_parquet(bad / "scan.parquet", index=False)
    else:
        rows.loc[i, ["median_s", "rate"]] = value
        rows.to_parquet(bad / "scan.parquet", index=False)
    scan = read_scan(bad)
    assert [(m, a, b) for m, a, b in scan.unmeasured()] == [(figure, rows.loc[i, "node_a"], rows.loc[i, "node_b"])]
    assert scan.flagged_nodes() == {}, "an unusable figure makes no node slow"
    code, _, err = run_main(capsys, ["report", "--scan", str(bad), "--out", str(tmp_path / "r")])
    assert code == 0, err
    assert f"{named} ({figure})" in (tmp_path / "r" / "report.md").read_text()
    code, out, _ = run_main(capsys, ["diff", str(good), str(bad), "--check"])
    assert code == 1 and f"without a usable figure in B: {named.replace('–', '-')} ({figure})" in out, out
    code, out, _ = run_main(capsys, ["diff", str(bad), str(good), "--check"])
    assert code == 0 and "usable" not in out, out


def _break(path: Path, how: str) -> None:
    meta, parquet = path / "scan.json", path / "scan.parquet"
    if how == "no scan.json":
        meta.unlink()
    elif how == "corrupt scan.json":
        meta.write_text("{not json")
    elif how == "scan.json not an object":
        meta.write_text("[1, 2]")
    elif how == "other schema":
        meta.write_text(json.dumps({"schema": "commcal.run", "version": 1, "nodes": ["a", "b"]}))
    elif how == "nodes not a list":
        meta.write_text(json.dumps({"schema": "commcal.scan", "version": 1, "nodes": "node1"}))
    elif how == "tolerance a string":
        meta.write_text(json.dumps({"schema": "commcal.scan", "version": 1, "nodes": ["node1", "node2"],
                                    "options": {"latency_tolerance": "lots"}}))
    elif how == "truncated parquet":
        parquet.write_bytes(parquet.read_bytes()[:200])
    elif how == "no parquet":
        parquet.unlink()
    elif how == "parquet lacks columns":
        import pandas as pd

        pd.read_parquet(parquet).drop(columns=["rate"]).to_parquet(parquet)
    elif how == "no pairs of its nodes":
        meta.write_text(json.dumps({"schema": "commcal.scan", "version": 1, "nodes": ["x", "y"]}))


@pytest.mark.parametrize("how", ["no scan.json", "corrupt scan.json", "scan.json not an object", "other schema",
                                 "nodes not a list", "tolerance a string", "truncated parquet", "no parquet",
                                 "parquet lacks columns", "no pairs of its nodes"])
def test_readers_answer_a_damaged_scan_with_one_line_and_exit_2(tmp_path, capsys, how):
    good, bad = scan_dir(tmp_path / "good"), scan_dir(tmp_path / "bad")
    _break(bad, how)
    for argv in (["report", "--scan", str(bad), "--out", str(tmp_path / "r")], ["diff", str(good), str(bad)]):
        if how == "no scan.json" and argv[0] == "diff":
            argv = ["diff", str(bad / "x"), str(good)]
        code, _, err = run_main(capsys, argv)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and "Traceback" not in err, (how, argv, err)


@pytest.mark.parametrize("text, seconds", [("30", 1800), ("1:30", 90), ("02:00:00", 7200), ("1-00", 86400),
                                           ("1-02:03", 93780), ("1-02:03:04", 93784)])
def test_slurm_time_limits(text, seconds):
    assert plan.parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "abc", "1:2:3:4", "0", "-5"])
def test_bad_time_limits_are_usage_errors(bad):
    from microbench.errors import UsageError

    with pytest.raises(UsageError):
        plan.parse_duration(bad)


def test_allocations_hold_every_visit_once_in_order_within_the_limit():
    est = plan.Estimate("sweep", 8, tuple(np.random.default_rng(0).uniform(0.1, 3, 5000)), 0, 0, 30.0)
    chunks = est.chunks(1800)
    assert chunks[0][0] == 0 and chunks[-1][1] == 4999
    assert all(b + 1 == c for (_, b, _), (c, _, _) in zip(chunks, chunks[1:]))
    assert all(t <= 0.9 * 1800 - 30 for _, _, t in chunks)
    assert len(chunks) == int(np.ceil(sum(est.visits) / (0.9 * 1800 - 30))) or len(chunks) == \
        int(np.ceil(sum(est.visits) / (0.9 * 1800 - 30))) + 1
    assert est.chunks(31) == []


def test_scan_estimate_grows_with_the_rounds_of_the_schedule():
    rule, m = StopRule(0.02, 10, budget_s=0.5), plan.Machine.default()
    small, big = (plan.scan_estimate(n, [8, 4 << 20], 1, rule, m, (32e6, 2.7e8)) for n in (64, 4096))
    assert len(big.visits) == 2 * (4095 + 2) and big.quiet_s <= big.worst_s
    per_round = (big.worst_s - big.launch_s) / 4095
    assert per_round == pytest.approx((small.worst_s - small.launch_s) / 63, rel=0.05)
    once = plan.scan_estimate(4096, [8, 4 << 20], 1, rule, m, (32e6, 2.7e8), recheck=False)
    assert len(once.visits) == 4095 + 2 and once.quiet_s == big.quiet_s
    assert big.worst_s - big.launch_s == pytest.approx(2 * (once.worst_s - once.launch_s), rel=1e-9)


def test_dry_runs_print_plans_without_mpi(capsys):
    code, out, err = run_main(capsys, ["scan", "--dry-run", "--nodes", "4096", "--time-limit", "1:00:00"])
    assert code == 0, err
    assert "4095 rounds" in out and "does not resume" in out
    code, out, err = run_main(capsys, ["sweep", "--dry-run", "--nodes", "256", "--gpus-per-node", "8",
                                       "--time-limit", "0:20:00"])
    assert code == 0, err
    assert "256 nodes x 8 ranks" in out and "sbatch --array=0-" in out and "%1 -N 256 --ntasks-per-node=8" in out
    code, _, err = run_main(capsys, ["sweep", "--dry-run"])
    assert code == 2 and "--nodes" in err
    code, _, err = run_main(capsys, ["sweep", "--ops", "allreduce"])
    assert code == 2 and "--out" in err


@pytest.mark.parametrize("args, says", [
    (["--nodes", "1"], "scan needs two nodes or more"),
    (["--nodes", "2", "--gemm-size", "3"], "--gemm-size 3: the operand is an n x n float32 matrix, n at least 2, so "
                                           "at least 16 bytes"),
    (["--nodes", "2", "--copy-size", "15"], "--copy-size 15: the operand is an n x n float32 matrix")])
def test_a_dry_run_refuses_what_a_scan_would_in_one_line(capsys, args, says):
    code, out, err = run_main(capsys, ["scan", "--dry-run", *args])
    assert code == 2 and out == "" and err.startswith(f"commcal: error: {says}") and err.count("\n") == 1, err


@pytest.mark.parametrize("args, says", [
    (["sweep", "--assume-bandwidth", "0"], "--assume-bandwidth: only a --dry-run plans with these"),
    (["sweep", "--nodes", "4", "--gpus-per-node", "8", "--assume-latency-us", "2"],
     "--nodes, --gpus-per-node, --assume-latency-us: only a --dry-run plans with these"),
    (["scan", "--time-limit", "1:00:00"], "--time-limit: only a --dry-run plans with these"),
    (["sweep", "--expect-world", "0"], "--expect-world must be 1 to 1048576, not 0"),
    (["scan", "--expect-world", "-2"], "--expect-world must be 1 to 1048576, not -2")])
def test_a_real_run_refuses_dry_run_options_and_a_world_of_no_ranks(capsys, tmp_path, args, says):
    code, out, err = run_main(capsys, [*args, "--out", str(tmp_path / "run")])
    assert code == 2 and out == "" and err.startswith(f"commcal: error: {says}") and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


@pytest.mark.mpi
def test_a_real_scan_of_three_ranks(tmp_path):
    out = tmp_path / "scan"
    args = ["scan", "--per-rank", "--quick", "--sizes", "8,256K", "--gemm-size", "64K", "--copy-size", "1M",
            "--out", str(out)]
    proc = run_mpi(3, args, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    scan = read_scan(out)
    assert len(scan.nodes) == 3 and len(set(scan.nodes)) == 3
    assert len(scan.pairs) == 3 * 2 and (scan.pairs["wrong"] == 0).all()
    assert sorted(zip(scan.pairs["node_a"], scan.pairs["node_b"])) == sorted(
        [(a, b) for a, b in combinations(scan.nodes, 2)] * 2)
    assert (scan.rows["rate"] > 0).all() and (scan.rows["median_s"] > 0).all()
    assert set(scan.node_values("gemm")) == set(scan.nodes) == set(scan.node_values("copy"))
    assert "flagged nodes:" in proc.stdout
    for r in scan.rechecks:          # whatever the first look flagged was measured again, the faster kept
        pair = scan.rows[(scan.rows["node_a"] == r.node_a) & (scan.rows["node_b"] == r.node_b) &
                         (scan.rows["op"] == r.op) & (scan.rows["size_bytes"] == r.size_bytes)]
        assert len(pair) == 1 and pair["median_s"].iloc[0] == min(r.first_s, r.second_s), (r, pair)
        assert f"rechecked {r.op} {r.node_a}" in proc.stdout
    refused = run_mpi(2, ["scan", "--out", str(tmp_path / "x")], timeout=60)
    assert refused.returncode == 2 and "one rank per node" in refused.stderr, refused.stderr
    too_big = run_mpi(2, ["scan", "--per-rank", "--gemm-size", "64T", "--out", str(tmp_path / "y")], timeout=60)
    assert too_big.returncode == 2 and "size 64T for gemm needs" in too_big.stderr, too_big.stderr
    assert not (tmp_path / "y").exists()


RECHECK_SUSPECTS = """
import argparse, json
from microbench import scan, scan_cmd
p = argparse.ArgumentParser()
scan_cmd.add_arguments(p)
args = p.parse_args(["--per-rank", "--quick", "--sizes", "8,64K", "--gemm-size", "64K", "--copy-size", "256K",
                     "--out", "unused"])
cfg = scan_cmd.build_config(args)
from mpi4py import MPI
from microbench.backends import backend_for
from microbench.scanfile import Suspects
world = MPI.COMM_WORLD
hosts = world.allgather(MPI.Get_processor_name())
nodes = scan_cmd.node_names(hosts, True)
backend = backend_for("mpi", world, hosts)
timer, _ = backend.make_timer(world, args.timing)
rows = scan.measure_pairs(world, nodes, cfg, timer, backend, None) + scan.measure_nodes(world, nodes, cfg, backend)
pair = world.bcast(next((r.node_a, r.node_b) for r in rows if r.kind == "pair") if world.rank == 0 else None)
kept, records = scan.recheck(world, nodes, cfg, timer, backend, rows, Suspects(pairs=(pair,), nodes=(nodes[-1],)), None)
if world.rank == 0:
    print(json.dumps({"pair": pair, "node": nodes[-1], "rows": len(rows), "kept": len(kept),
                      "records": sorted([r.op, r.node_a, r.node_b, r.size_bytes] for r in records)}))
"""


def test_a_recheck_measures_the_suspects_and_nothing_else():
    """3 real ranks: given one suspect pair and one suspect node, the second look measures that pair at every size and
    that node's copy and GEMM, and no other figure (each figure measured twice leaves a record)."""
    proc = subprocess.run([*mpiexec_argv(3), sys.executable, "-c", RECHECK_SUSPECTS], env=mpi_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    (a, b), node = got["pair"], got["node"]
    assert got["kept"] == got["rows"] == 3 * 2 + 3 * 2
    assert got["records"] == sorted([["pingpong", a, b, 8], ["pingpong", a, b, 65536], ["copy", node, "", 262144],
                                     ["gemm", node, "", 65536]]), got


def test_the_scan_vocabulary_and_its_readers_leave_mpi4py_alone():
    import subprocess
    import sys

    code = ("import sys; import microbench.schedule, microbench.outliers, microbench.scanfile, microbench.plan, "
            "microbench.scan_cmd, reports.scan_view, reports.scan_diff, reports.diff_cmd, reports.report_cmd; "
            "from reports.cli import main; main(['scan', '--dry-run', '--nodes', '8']); "
            "bad = [m for m in ('mpi4py', 'cupy') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and "7 rounds" in proc.stdout, proc.stdout + proc.stderr
