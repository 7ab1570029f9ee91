"""`commcal sweep` on real mpirun jobs: correct results, the expected records, resume after a
SIGKILL, and one-line errors with exit code 2 for bad input."""

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import time

from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO, commcal_argv, mpi_env, mpiexec_argv, run_cli, run_main, run_mpi
from calib.calibration import load_calibration
from microbench.ops import OPS
from microbench.sizes import parse_size
from microbench.stats import pooled_estimate
from microbench.records import SAMPLE_COLUMNS, SUMMARY_COLUMNS, load_samples, load_summary, read_run_json

pytestmark = pytest.mark.mpi
FAST = ["--point-budget", "0.05", "--min-samples", "6", "--target-ci", "0.5", "--bisect", "0"]
SIZES = "8,1000,64K"


@pytest.mark.parametrize("ranks", [2, 4])
def test_every_operation_is_correct_and_recorded(tmp_path, ranks):
    out = tmp_path / "run"
    proc = run_mpi(ranks, ["sweep", "--out", str(out), "--sizes", SIZES, "--gemm-sizes", "4K", *FAST], check=True)
    summary = load_summary(out)
    assert list(summary.columns) == list(SUMMARY_COLUMNS)
    assert (summary["wrong"] == 0).all()
    procs = [2, 4] if ranks == 4 else [2]
    expected = {(op, "intra", p, s) for op in OPS if OPS[op].kind == "collective" for p in procs
                for s in (8, 1000, 65536)}
    expected |= {(op, "intra", 2, s) for op in ("pingpong", "sendrecv") for s in (8, 1000, 65536)}
    expected |= {("gemm", "intra", 1, 4096), ("copy", "intra", 1, 4096)}
    got = set(zip(summary.op, summary.link, summary.procs, summary.requested_bytes))
    assert got == expected
    assert summary.point_id.is_unique
    assert (summary.samples >= 6).all()
    assert (summary.ci_low_s <= summary.median_s).all() and (summary.median_s <= summary.ci_high_s).all()
    assert (summary.min_s <= summary.median_s).all() and (summary.median_s <= summary.p95_s).all()
    comm = summary[~summary.op.isin(["gemm", "copy"])]
    assert (comm.nodes == 1).all() and (comm.ranks_per_node == comm.procs).all()
    row = comm[(comm.op == "allreduce") & (comm.procs == 2) & (comm.requested_bytes == 65536)].iloc[0]
    assert row.busbw_Bps == pytest.approx(row.size_bytes / row.median_s * 1.0)
    assert row.bytes_per_rank == pytest.approx(65536.0)
    ag = comm[(comm.op == "allgather") & (comm.procs == procs[-1]) & (comm.requested_bytes == 1000)].iloc[0]
    assert ag.size_bytes == (1000 // 4 // procs[-1]) * procs[-1] * 4
    gemm = summary[summary.op == "gemm"]
    assert set(gemm.dtype) == {"float32", "float64"} and (gemm.flops_per_s > 0).all()
    samples = load_samples(out)
    assert list(samples.columns) == list(SAMPLE_COLUMNS)
    counts = samples.groupby("point_id").size()
    assert counts.reindex(summary.point_id).tolist() == summary.samples.tolist()
    assert (samples.time_s > 0).all()
    pd.testing.assert_frame_equal(pd.read_csv(out / "summary.csv")[["point_id", "samples"]],
                                  summary[["point_id", "samples"]])
    meta = read_run_json(out)
    assert meta["world_size"] == ranks and meta["timing_path"] in ("c", "python")
    assert meta["end_time"] and meta["mpi_library_version"] and meta["versions"]["mpi4py"]
    assert meta["page_policy"] == "nohugepage" and meta["memcpy_alias_slowdown"] > 0
    assert meta["options"]["cache"] == "cold"
    assert "OMPI_ALLOW_RUN_AS_ROOT" in meta["environment"]
    assert set(meta["cpu_steal"]) == set(meta["hosts"]) and all(0 <= f <= 1 for f in meta["cpu_steal"].values())
    assert "allreduce" in proc.stdout and "done" in proc.stdout and "(steal): " in proc.stdout
    cpus = len(os.sched_getaffinity(0))                 # unbound ranks may run on what this process may
    if ranks > cpus:                                    # ranks time-share the cores: recorded, and said
        assert meta["cpu_sharing"] == {"ranks": ranks, "cpus": cpus}, meta["cpu_sharing"]
        assert f"warning: {ranks} ranks share {cpus} CPU(s) of one machine" in proc.stdout, proc.stdout
    elif not os.environ.get("MPIEXEC"):                 # a launcher of the user's may bind ranks to fewer cores
        assert meta["cpu_sharing"] is None and "ranks share" not in proc.stdout, proc.stdout


def cpu_cgroup(name: str, quota_us: int, period_us: int = 100000) -> Path | None:
    """A new cgroup allowing quota_us of CPU time per period_us (cgroup v1's cpu controller, or v2's cpu.max), made
    for a test; None where this process cannot make one (not root, or no cpu controller enabled for new groups)."""
    v1, v2 = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
    try:
        if (v1 / "cpu.cfs_quota_us").is_file():
            group = v1 / name
            group.mkdir()
            (group / "cpu.cfs_period_us").write_text(str(period_us))
            (group / "cpu.cfs_quota_us").write_text(str(quota_us))
            return group
        if "cpu" in (v2 / "cgroup.subtree_control").read_text().split():   # left as the host has it
            group = v2 / name
            group.mkdir()
            (group / "cpu.max").write_text(f"{quota_us} {period_us}")
            return group
    except OSError:
        pass
    return None


def test_a_cpu_quota_narrower_than_the_affinity_is_recorded_as_sharing(tmp_path):
    """Two ranks in a real cgroup allowed 1.5 CPUs of CPU time (a container's --cpus, a job's CPUQuota), their
    affinity left wide: the sweep counts the quota, not the affinity, says so once and records 2 ranks on 1 CPU."""
    if os.environ.get("MPIEXEC"):
        pytest.skip("a custom MPIEXEC may place ranks outside this host's cgroup")
    group = cpu_cgroup(f"commcal-test-{os.getpid()}", 150000)
    if group is None:
        pytest.skip("cannot make a cgroup with a CPU quota here (needs root and a writable cpu controller)")
    out = tmp_path / "run"
    try:
        enter = ["sh", "-c", f'echo $$ > {group / "cgroup.procs"} && exec "$@"', "sh"]
        proc = subprocess.run([*enter, *mpiexec_argv(2), *commcal_argv(), "sweep", "--out", str(out), "--ops",
                               "pingpong", "--sizes", "8", *FAST], env=mpi_env(), cwd=REPO, capture_output=True,
                              text=True, timeout=120)
    finally:
        for _ in range(50):                     # the launcher's daemons may take a moment to leave the group
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert read_run_json(out)["cpu_sharing"] == {"ranks": 2, "cpus": 1}
    assert proc.stdout.count("warning: 2 ranks share 1 CPU(s) of one machine") == 1, proc.stdout


def test_python_timing_path_is_recorded(tmp_path):
    out = tmp_path / "run"
    run_mpi(2, ["sweep", "--out", str(out), "--ops", "pingpong", "--sizes", "8", "--timing", "python", *FAST],
            check=True)
    assert read_run_json(out)["timing_path"] == "python"
    assert set(load_summary(out).timing_path) == {"python"}


ROTATION = textwrap.dedent("""
    import time
    import numpy as np
    from mpi4py import MPI
    from microbench import driver
    from microbench.backends import MpiBackend
    from microbench.buffers import Pool, Slots
    from microbench.ops import OPS, Layout
    from microbench.stats import StopRule

    world = MPI.COMM_WORLD
    op, n = OPS["allreduce"], 6
    lay = Layout(n * 4, n * 4, n, n, n, 4)
    bad = 0
    for choice in ("c", "python"):
        timer, note = driver.make_timer(world, choice)
        send, recv = op.fill(np, lay, "float32", world.rank, world.size)
        slots = Pool(np, 16 * 4096).slots(send, recv)
        assert slots.count == 16 and slots.stride == 4096, (slots.count, slots.stride)
        for i in range(slots.count):
            slots.pair(i)[1][:] = 0
        timer.run(op, world, slots, 11, lay, "float32", slots.count)   # starts at slot 11, wraps round
        want = op.expected(np, lay, "float32", world.rank, world.size)
        bad += sum(int((slots.pair(i)[1] != want).any()) for i in range(slots.count))
        t0 = time.perf_counter()
        timer.run(op, world, slots, 0, lay, "float32", 5, 0.04)           # 40 ms idle before each call
        print(choice, "spaced", time.perf_counter() - t0 >= 0.2)
        alone = Slots(*op.fill(np, lay, "float32", 0, 1))
        if world.rank == 1:
            time.sleep(0.3)
        t0 = time.perf_counter()
        took = timer.run(op, MPI.COMM_SELF, alone, 0, lay, "float32", 1, 0.0, world)   # the barrier spans world
        if world.rank == 0:
            print(choice, "barrier on bar", time.perf_counter() - t0 >= 0.25 and took[0] < 0.1)
        ran = []
        rule = StopRule(target_ci=0.0, min_samples=6, budget_s=0.0)
        m = driver.measure_collective(op, world, lay, "float32", rule, timer, MpiBackend(world, []),
                                      before=lambda: ran.append(time.sleep(0.02)))
        print(choice, "before each", len(ran) == m.samples.size + 2, m.samples.max() < 0.02)
    print("slots wrong", world.allreduce(bad))
""")


def test_timed_iterations_rotate_through_every_cold_slot_and_keep_their_gap(tmp_path):
    """Both timers: cold slots in turn, the idle gap, the barrier on the communicator given for it, and
    (sweep --after-gemm) the compute run before every iteration, warm-up included, outside the timed region."""
    script = tmp_path / "rotation.py"
    script.write_text(ROTATION)
    proc = subprocess.run([*mpiexec_argv(2), sys.executable, str(script)], env=mpi_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0 and "slots wrong 0" in proc.stdout, proc.stdout + proc.stderr
    assert proc.stdout.count("spaced True") == 4 and "False" not in proc.stdout, proc.stdout
    assert proc.stdout.count("barrier on bar True") == 2, proc.stdout
    assert proc.stdout.count("before each True True") == 4, proc.stdout


LOCAL_ROTATION = textwrap.dedent("""
    import numpy as np
    from mpi4py import MPI
    from microbench import driver
    from microbench.backends import MpiBackend
    from microbench.buffers import Pool
    from microbench.ops import OPS
    from microbench.stats import StopRule

    class Recording(Pool):
        def slots(self, send, recv, in_place=False):
            self.last = super().slots(send, recv, in_place)
            return self.last

    world, n = MPI.COMM_WORLD, 64
    backend = MpiBackend(world, [])
    for name in ("copy", "gemm"):
        pool = Recording(np, 12 * 3 * n * n * 4)
        lay = OPS[name].layout(n * n * 4, 1, 4)
        rule = StopRule(target_ci=0.0, min_samples=30, budget_s=0.0)
        m = driver.measure_local(OPS[name], lay, "float32", rule, backend, world, pool)
        slots = pool.last
        src = slots.pair(0)[0]
        want = np.stack([src[:, :n // 2], src[:, n // 2:]]) if name == "copy" else src[0] @ src[1]
        bad = sum(int(not np.allclose(slots.pair(i)[1], want, rtol=1e-5)) for i in range(slots.count))
        print(name, "slots", slots.count, "samples", m.samples.size, "wrong", m.wrong, "bad", bad)
""")


LOCKSTEP = textwrap.dedent("""
    import time
    import numpy as np
    from mpi4py import MPI
    from microbench import driver
    from microbench.stats import StopRule

    world = MPI.COMM_WORLD
    spans = []

    def run(i):
        t0 = time.monotonic()
        if world.rank == 0:
            time.sleep(0.004)
        spans.append((t0, time.monotonic()))

    rule = StopRule(target_ci=0.0, min_samples=20, budget_s=0.0)
    m = driver._measure_local(lambda i: i, run, lambda: None, rule, world, 0)
    every = world.gather(np.array(spans), root=0)
    if world.rank == 0:
        late = sum(int(other[i + 1, 0] < every[0][i, 1]) for other in every[1:] for i in range(len(other) - 1))
        print("iterations", len(spans), "samples", m.samples.size, "early starts", late,
              "median ms", round(float(np.median(m.samples)) * 1e3, 2))
    # fetching an iteration's arrays (slot views: microseconds each on a GPU) lies outside the timed call
    fetched = driver._measure_local(lambda i: time.sleep(0.004), lambda arrays: None, lambda: None, rule, world, 0)
    if world.rank == 0:
        print("fetch ms", round(float(np.median(fetched.samples)) * 1e3, 3))
""")


def test_concurrent_local_iterations_start_together(tmp_path):
    """With every rank measuring a local operation at once, no rank starts its next iteration before the others
    have finished theirs (rank 0 takes 4 ms, the others nothing), so each sample times one shared moment; fetching
    an iteration's arrays (4 ms here) is not timed."""
    script = tmp_path / "lockstep.py"
    script.write_text(LOCKSTEP)
    proc = subprocess.run([*mpiexec_argv(3), sys.executable, str(script)], env=mpi_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    words = proc.stdout.split()
    assert int(words[words.index("iterations") + 1]) >= 20 and words[words.index("early") + 2] == "0", proc.stdout
    assert float(words[words.index("median") + 2]) >= 4.0, proc.stdout
    assert float(words[words.index("fetch") + 2]) < 1.0, proc.stdout


def test_gemm_and_copy_rotate_through_every_cold_slot(tmp_path):
    """Cold local operations, like cold collectives, take each iteration's operands from the next slot."""
    script = tmp_path / "local_rotation.py"
    script.write_text(LOCAL_ROTATION)
    proc = subprocess.run([*mpiexec_argv(2), sys.executable, str(script)], env=mpi_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if " slots " in line]
    assert sorted(r[0] for r in rows) == ["copy", "copy", "gemm", "gemm"], proc.stdout
    for r in rows:
        assert int(r[2]) >= 12 and int(r[4]) >= 30 and r[6] == "0" and r[8] == "0", proc.stdout


def test_runs_timed_in_other_conditions_do_not_mix(tmp_path, capsys):
    """Cold and warm buffers, buffers with and without huge pages, or calls with and without an idle gap or a GEMM
    before them, neither resume nor fit together."""
    runs = {"cold": [], "warm": ["--cache", "warm"], "gap": ["--gap-ms", "2"], "gemm": ["--after-gemm", "32"],
            "huge": ["--page-policy", "hugepage"]}
    for name, extra in runs.items():
        run_mpi(2, ["sweep", "--out", str(tmp_path / name), "--ops", "pingpong", "--sizes", "8,64", *extra, *FAST],
                check=True)
    options = {name: read_run_json(tmp_path / name)["options"] for name in runs}
    assert [(o["cache"], o["gap_ms"], o["after_gemm"]) for o in options.values()] == [
        ("cold", 0, 0), ("warm", 0, 0), ("cold", 2, 0), ("cold", 0, 32), ("cold", 0, 0)]
    for name, extra, says in (("cold", ["--cache", "warm"], "measured with --cache cold, not warm"),
                              ("cold", ["--page-policy", "hugepage"], "measured with --page-policy nohugepage, not "
                                                                      "hugepage"),
                              ("gap", [], "measured with --gap-ms 2, not 0"),
                              ("gemm", ["--after-gemm", "64"], "measured with --after-gemm 32, not 64")):
        resumed = run_mpi(2, ["sweep", "--out", str(tmp_path / name), "--ops", "pingpong", "--sizes", "8,64",
                              "--resume", *extra, *FAST])
        assert resumed.returncode == 2 and says in resumed.stderr, resumed.stderr
    cal = tmp_path / "cal.json"
    for pair, says in ((("cold", "warm"), "mix cold and warm buffers"), (("cold", "gap"), "mix gaps of 0 and 2 ms"),
                       (("cold", "gemm"), "mix GEMMs of N = 0 and 32"),
                       (("huge", "cold"), "mix hugepage and nohugepage host buffers")):
        code, _, err = run_main(capsys, ["fit", *(str(tmp_path / n) for n in pair), "--out", str(cal)])
        assert code == 2 and says in err, err
        assert not cal.exists()
    code, _, err = run_main(capsys, ["fit", str(tmp_path / "huge"), "--after-compute", str(tmp_path / "gemm"),
                                     "--out", str(cal)])
    assert code == 2 and "mix hugepage and nohugepage" in err, err
    for name, want in (("gap", ("cold", 2, 0, "nohugepage")), ("gemm", ("cold", 0, 32, "nohugepage")),
                       ("huge", ("cold", 0, 0, "hugepage"))):
        assert run_main(capsys, ["fit", str(tmp_path / name), "--out", str(cal)])[0] == 0
        runs = json.loads(cal.read_text())["provenance"]["runs"]
        assert [(r["cache"], r["gap_ms"], r["after_gemm"], r["page_policy"]) for r in runs] == [want]
        assert load_calibration(cal).page_policy == want[3]


def test_after_gemm_leaves_out_the_local_operations_the_main_sweep_measures(tmp_path):
    """A GEMM before a gemm or copy point changes nothing the after-compute models use: the sweep says it leaves
    them out and measures only the communication."""
    out = tmp_path / "after"
    proc = run_mpi(2, ["sweep", "--out", str(out), "--ops", "pingpong,gemm,copy", "--sizes", "8,64",
                       "--gemm-sizes", "4K", "--after-gemm", "16", *FAST], check=True)
    assert "(gemm, copy left out: measured by a sweep without --after-gemm)" in proc.stdout, proc.stdout
    assert set(load_summary(out)["op"]) == {"pingpong"}


def _visits(out) -> dict[str, tuple[int, int, int]]:
    """Each point on disk: (its record's mtime, visits pooled, samples)."""
    found = {}
    for f in (out / "points").glob("*.json"):
        rec = json.loads(f.read_text())
        found[f.stem] = (f.stat().st_mtime_ns, rec["rounds"], rec["samples"])
    return found


def test_killed_rank_then_resume_finishes_each_point_once_keeping_earlier_visits(tmp_path):
    out = tmp_path / "run"
    args = ["sweep", "--out", str(out), "--ops", "allreduce,bcast,alltoall", "--sizes", "8:4K", "--rounds", "2",
            "--retries", "0", "--point-budget", "0.15", "--min-samples", "6", "--target-ci", "0.001", "--bisect", "0"]
    job = subprocess.Popen([*mpiexec_argv(2), *commcal_argv(), *args], env=mpi_env(), cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while sum(r == 2 for _, r, _ in _visits(out).values()) < 4:   # killed in the second pass
        assert time.monotonic() < deadline and job.poll() is None, "sweep ended before it could be killed"
        time.sleep(0.1)
    ranks = subprocess.run(["pgrep", "-f", "-s", str(job.pid), "reports.cli sweep"], capture_output=True,
                           text=True).stdout.split()
    assert ranks, "no rank process found"
    os.kill(int(ranks[-1]), signal.SIGKILL)
    job.communicate(timeout=120)
    assert job.returncode != 0
    before = _visits(out)
    finished = {pid for pid, (_, r, _) in before.items() if r == 2}
    assert len(before) == 3 * 10 and 4 <= len(finished) < 3 * 10
    first_pass = {pid: pd.read_parquet(out / "points" / f"{pid}.parquet").query("round == 0").time_s.tolist()
                  for pid in before}
    assert not (out / "summary.parquet").exists()
    proc = run_mpi(2, [*args, "--resume"], check=True)
    assert f"30 points ({len(finished)} already done, {30 - len(finished)} partly)" in proc.stdout, proc.stdout
    after = _visits(out)
    for pid, (mtime, rounds, n) in before.items():
        if pid in finished:
            assert after[pid] == before[pid], f"{pid} was finished but measured again"
        else:
            assert after[pid][1] == 2 and after[pid][2] > n, f"{pid}: the second visit was not added"
    summary = load_summary(out)
    assert len(summary) == 3 * 10 and summary.point_id.is_unique and (summary.rounds == 2).all()
    samples = load_samples(out)
    assert set(samples.point_id) == set(summary.point_id)
    for pid, times in first_pass.items():
        assert samples[(samples.point_id == pid) & (samples["round"] == 0)].time_s.tolist() == times
    meta = read_run_json(out)
    assert len(meta["resumed_at"]) == 1
    assert set(summary.run_id) == {meta["run_id"]}
    assert not list(out.glob("**/.*.tmp")), "half-written temporary files left behind"


def test_points_are_visited_in_rounds_and_those_missing_the_target_again_pooling_every_visit(tmp_path):
    out = tmp_path / "run"
    proc = run_mpi(2, ["sweep", "--out", str(out), "--ops", "pingpong", "--sizes", "8,64,256K", "--point-budget",
                       "0.05", "--min-samples", "6", "--target-ci", "0.0001", "--rounds", "2", "--retries", "2"],
                   check=True)
    rows = re.findall(r"^\s*(\S+(?: \d)?)\s+pingpong\s+intra\s+2\s+(\S+)\s+\S+us\s+\S+?%(\*?)\s+(\d+)", proc.stdout,
                      re.M)
    visits = {}
    for where, size, missed, n in rows:
        visits.setdefault(parse_size(size), []).append((where, missed == "*", int(n)))
    # passes over the whole plan first; then a point is visited again (at most twice) only while its pooled
    # samples miss the 0.01% target: 256 KiB copies vary by far more than that; 8 and 64 B calls, timed to the
    # timer's resolution, may tie so often that their median's CI closes (a quiet host)
    assert [(w, s) for w, s, _, _ in rows[:6]] == [("1/6", "8"), ("2/6", "64"), ("3/6", "256K"), ("4/6", "8"),
                                                   ("5/6", "64"), ("6/6", "256K")]
    assert any(len(v) > 2 for v in visits.values()), proc.stdout
    for v in visits.values():
        assert [w for w, _, _ in v[2:]] == ["retry 1", "retry 2"][:len(v) - 2], proc.stdout
        assert all(len(v) > i + 1 or not missed or i == 3 for i, (_, missed, _) in enumerate(v) if i >= 1)
        assert all(missed for _, missed, _ in v[1:-1]), proc.stdout
        assert [n for _, _, n in v] == sorted(n for _, _, n in v) and v[0][2] < v[-1][2], "every visit adds samples"
    summary = load_summary(out).set_index("point_id")
    samples = load_samples(out)
    assert len(summary) == 3
    for pid, mine in samples.groupby("point_id"):
        row = summary.loc[pid]
        seen = visits[int(row.size_bytes)]
        assert row.rounds == len(seen) and bool(row.target_met) == (not seen[-1][1])
        assert sorted(mine["round"].unique()) == list(range(len(seen))) and len(mine) == row.samples
        by_round = [v.to_numpy() for _, v in mine.groupby("round").time_s]
        assert row.median_s == pytest.approx(pooled_estimate(by_round).median)   # every visit weighs the same
        medians = mine.groupby("round").time_s.median()
        assert row.round_spread == pytest.approx((medians.max() - medians.min()) / 2 / row.median_s)
    assert read_run_json(out)["options"]["retries"] == 2 and read_run_json(out)["options"]["rounds"] == 2


def test_concurrent_sweep_measures_every_group_at_once_and_fits(tmp_path, capsys):
    """4 ranks on one host: intra pairs (0,1) and (2,3) run at once, and all 4 multiply at once; the fit
    records both for the pricer."""
    out = tmp_path / "run"
    args = ["--ops", "allreduce,pingpong,gemm,copy", "--links", "intra", "--procs", "2", "--sizes", "8,1K,64K,1M",
            "--gemm-sizes", "64K,256K", *FAST]
    run_mpi(4, ["sweep", "--out", str(out), "--concurrent", *args], check=True)
    summary = load_summary(out)
    local = summary.op.isin(["gemm", "copy"])
    comm, gemm, copy = summary[~local], summary[summary.op == "gemm"], summary[summary.op == "copy"]
    assert len(comm) == 8 and len(gemm) == 4 and len(copy) == 2 and (summary.wrong == 0).all()
    assert (comm.groups == 2).all() and (comm.groups_per_node == 2).all()
    assert (summary[local].groups == 4).all() and (summary[local].groups_per_node == 4).all()
    assert comm.point_id.str.endswith("-x2").all() and summary[local].point_id.str.endswith("-x4").all()
    assert set(copy.dtype) == {"float32"} and (copy.busbw_Bps == 2 * copy.size_bytes / copy.median_s).all()
    assert read_run_json(out)["options"]["concurrent"] is True
    cal = tmp_path / "cal.json"
    assert run_main(capsys, ["fit", str(out), "--out", str(cal)])[0] == 0
    data = json.loads(cal.read_text())
    assert data["link_classes"]["intra"]["groups_per_node"] == 2
    assert data["compute"]["gemm"]["float32"]["groups_per_node"] == 4
    assert data["compute"]["copy"]["groups_per_node"] == 4 and data["compute"]["copy"]["bytes_per_s"] > 1e8
    # one-group points of the same shape do not fit together with concurrent ones
    single = tmp_path / "single"
    run_mpi(2, ["sweep", "--out", str(single), *args], check=True)
    assert (load_summary(single).groups == 1).all()
    code, _, err = run_main(capsys, ["fit", str(out), str(single), "--out", str(tmp_path / "mixed.json")])
    assert code == 2 and "mix concurrent and one-group" in err, err
    assert not (tmp_path / "mixed.json").exists()


@pytest.mark.parametrize("args,message", [
    (["--ops", "allreduce,bogus"], "unknown operation 'bogus'"),
    (["--sizes", "8:x"], "malformed size"),
    (["--sizes", "64M:8"], "is empty"),
    (["--procs", "2,4"], "larger than the world (2 ranks)"),
    (["--sizes", "8T"], "available per rank"),
    (["--links", "wan"], "unknown link class"),
    (["--target-ci", "2"], "--target-ci"),
    (["--min-samples", "3"], "at least 6"),
    (["--retries", "-1"], "--retries"),
    (["--gap-ms", "-1"], "--gap-ms must be between 0 and 1000"),
    (["--after-gemm", "-4"], "--after-gemm must be between 0 and 8192"),
    (["--ops", "gemm,copy", "--after-gemm", "32"], "--after-gemm times collectives after a GEMM and --ops names none"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    proc = run_mpi(2, ["sweep", "--out", str(tmp_path / "r"), *args])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("commcal: error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "r" / "points").exists() or not list((tmp_path / "r" / "points").iterdir())


def test_existing_run_needs_resume(tmp_path):
    out = tmp_path / "run"
    run_mpi(2, ["sweep", "--out", str(out), "--ops", "pingpong", "--sizes", "8", *FAST], check=True)
    before = (out / "summary.parquet").read_bytes()
    proc = run_mpi(2, ["sweep", "--out", str(out), "--ops", "pingpong", "--sizes", "8", *FAST])
    assert proc.returncode == 2 and "--resume" in proc.stderr
    assert (out / "summary.parquet").read_bytes() == before


def test_world_size_not_matching_slurm_tasks_is_refused(tmp_path):
    """A size-1 world where Slurm started 2 tasks: what Open MPI does under srun --mpi=pmi2."""
    env = {k: v for k, v in mpi_env().items() if not k.startswith(("PRTE_", "PMIX_", "OMPI_COMM"))}
    env.update(SLURM_STEP_NUM_TASKS="2", SLURM_NTASKS="2", SLURM_PROCID="0")
    proc = run_cli(["sweep", "--out", str(tmp_path / "r"), "--ops", "pingpong"], env=env)
    assert proc.returncode == 2
    assert "MPI world has 1 ranks but Slurm started 2 tasks" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()


def test_a_sweep_split_over_two_launches_records_each_launch_and_the_fit_their_spread(tmp_path, capsys):
    """The default path's sweep runs its rounds in two MPI launches (a run and its resumption): every sample names
    its launch, every point pools both with their spread, and the calibration keeps the spread per model."""
    out, cal = tmp_path / "run", tmp_path / "cal.json"
    args = ["sweep", "--out", str(out), "--ops", "allreduce,pingpong", "--sizes", "1K:64K", "--retries", "0", *FAST]
    run_mpi(2, [*args, "--rounds", "1"], check=True)
    run_mpi(2, [*args, "--rounds", "2", "--resume"], check=True)
    summary, samples = load_summary(out), load_samples(out)
    assert (summary.launches == 2).all() and (summary.rounds == 2).all()
    assert set(samples["launch"]) == {0, 1} and (samples["launch"] == samples["round"]).all()
    for pid, g in samples.groupby("point_id"):
        row = summary.set_index("point_id").loc[pid]
        medians = [g[g.launch == k].time_s.median() for k in (0, 1)]
        assert row.launch_spread == pytest.approx(abs(medians[0] - medians[1]) / 2 / row.median_s, rel=1e-6)
    assert run_main(capsys, ["fit", str(out), "--out", str(cal)])[0] == 0
    model = load_calibration(cal).result.models[("pingpong", "intra")]
    spread = model.launch_spread
    assert spread is not None and spread.launches == 2 and spread.n_points == 7
    assert spread.max == pytest.approx(summary[summary.op == "pingpong"].launch_spread.max())


def test_bisection_measures_the_middle_of_a_flagged_interval_and_a_resumed_launch_finishes_it(tmp_path):
    """--bisect: where a run's time grows faster than its size between adjacent sizes (here a stored 4 KiB point made
    16x slower stands for the regime change), the sweep measures the interval's middle, as a point of its own beside
    a held-out point at the same size, and one element under the power of two that ends it, records them in
    bisect.json, and a resumed launch plans them again for their remaining rounds without bisecting past --bisect
    passes."""
    out = tmp_path / "run"
    base = ["sweep", "--out", str(out), "--ops", "pingpong", "--sizes", "1K,4K", "--held-out", "2K", "--retries", "0",
            "--point-budget", "0.05", "--min-samples", "6", "--target-ci", "0.5"]
    run_mpi(2, [*base, "--rounds", "1", "--bisect", "0"], check=True)
    assert not (out / "bisect.json").exists()
    slow = next(f for f in (out / "points").glob("*.json") if json.loads(f.read_text())["requested_bytes"] == 4096)
    rec = json.loads(slow.read_text())
    slow.write_text(json.dumps(rec | {k: rec[k] * 16 for k in ("median_s", "ci_low_s", "ci_high_s")}))
    run_mpi(2, [*base, "--rounds", "1", "--bisect", "1", "--resume"], check=True)
    record = json.loads((out / "bisect.json").read_text())
    assert record["passes"] == 1 and len(record["points"]) == 2, record
    added = sorted(record["points"], key=lambda pt: pt["requested_bytes"])
    assert {(pt["op"], pt["link"], pt["procs"], pt["pass"]) for pt in added} == {("pingpong", "intra", 2, 1)}
    # the interval's geometric middle (2048 B), one element off the held-out point there; one float32 under 4 KiB
    assert 2048 < added[0]["requested_bytes"] <= 2048 + 8 and added[1]["requested_bytes"] == 4092, added
    proc = run_mpi(2, [*base, "--rounds", "2", "--bisect", "1", "--resume"], check=True)
    assert "5 points (0 already done, 5 partly)" in proc.stdout, proc.stdout
    summary = load_summary(out).set_index("requested_bytes")
    assert sorted(summary.index) == sorted([1024, 2048, 4096, *(pt["requested_bytes"] for pt in added)])
    for pt in added:
        assert summary.loc[pt["requested_bytes"], ["rounds", "launches"]].tolist() == [2, 2], summary
    assert json.loads((out / "bisect.json").read_text()) == record                # no pass past --bisect 1
    options = read_run_json(out)["options"]
    assert options["bisect"] == 1 and options["held_out"] == [2048]


def test_between_benchmark_measures_each_run_over_launches_as_sweep_sh_does(tmp_path):
    """benchmarks.between measures the calibration the default path gives: each run's three rounds split over two MPI
    launches (launch 1 rounds 0-1, launch 2 round 2, as slurm/sweep.sh splits them), and prints its between-size
    table from them; --launches 1 keeps each run in one launch."""
    argv = [sys.executable, "-m", "benchmarks.between", "--launch", shlex.join(mpiexec_argv(2)), "--grid", "1K,2K,4K",
            "--ops", "pingpong", "--sweep-args", shlex.join(["--retries", "0", *FAST])]
    for launches, rounds_of_launch in ((2, [0, 0, 1]), (1, [0, 0, 0])):
        out = tmp_path / f"l{launches}"
        proc = subprocess.run([*argv, "--out", str(out), "--launches", str(launches)], env=mpi_env(), cwd=REPO,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode in (0, 1) and re.search(r"^pingpong\s+intra", proc.stdout, re.M), \
            proc.stdout + proc.stderr
        for run in ("A", "B"):
            summary, samples = load_summary(out / run), load_samples(out / run)
            assert (summary.launches == launches).all() and (summary.rounds == 3).all(), summary
            by_round = samples.groupby("round")["launch"].agg(set)
            assert [by_round[r] for r in range(3)] == [{k} for k in rounds_of_launch]
    # --rescore: the stored runs fitted and scored again, nothing measured: the same table; no stored run, one line
    table = lambda text: [line for line in text.splitlines() if line.startswith(("op ", "pingpong "))]  # noqa: E731
    again = subprocess.run([*argv, "--out", str(out), "--rescore"], cwd=REPO, capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == proc.returncode and table(again.stdout) == table(proc.stdout), \
        again.stdout + again.stderr
    assert "each run:" not in again.stdout and load_summary(out / "B").equals(summary)
    none = subprocess.run([*argv, "--out", str(tmp_path / "none"), "--rescore"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert none.returncode == 2 and none.stderr.strip().endswith("no run of this benchmark (run.json with its sizes "
                                                                 "and held-out sizes) to rescore"), none.stderr


def test_topology_file_is_recorded_and_bad_ones_are_one_line(tmp_path):
    """--topology: run.json records the levels of the job's nodes; a missing file, or one not naming this job's node,
    is one line and exit 2 (the node names come from MPI, so this host must be in the file)."""
    host = socket.gethostname()
    conf = tmp_path / "topology.conf"
    conf.write_text(f"SwitchName=leaf Nodes={host},other1\nSwitchName=leaf2 Nodes=other2\n"
                    "SwitchName=top Switches=leaf,leaf2\n")
    out = tmp_path / "run"
    proc = run_mpi(2, ["sweep", "--out", str(out), "--ops", "pingpong", "--sizes", "8", "--topology", str(conf), *FAST])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = json.loads((out / "run.json").read_text())
    assert run["topology"] == {"source": str(conf), "levels": [{"link": "inter", "level": 1, "groups": [[host]]},
                                                               {"link": "inter2", "level": 2, "groups": [[host]]}]}
    assert set(pd.read_csv(out / "summary.csv")["link"]) == {"intra"}       # one node: no level crossed
    for text, says in ((None, "cannot read"), ("SwitchName=leaf Nodes=elsewhere\n", f"does not name node '{host}'")):
        bad = tmp_path / "bad.conf"
        if text:
            bad.write_text(text)
        proc = run_mpi(2, ["sweep", "--out", str(tmp_path / "r"), "--topology", str(bad), *FAST])
        errors = [line for line in proc.stderr.splitlines() if line.startswith("commcal: error:")]
        assert proc.returncode == 2 and len(errors) == 1 and says in errors[0], proc.stderr
        assert "Traceback" not in proc.stderr
    # without a switch tree the machine is flat: a level it lacks is refused once the job's topology is known
    proc = run_mpi(2, ["sweep", "--out", str(tmp_path / "flat"), "--links", "intra,inter2", *FAST])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("commcal: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "inter2: the topology has 1 switch level" in errors[0], \
        proc.stderr


def test_an_error_one_rank_meets_ends_the_job_with_its_line(tmp_path):
    """A path the file system refuses (a name over 255 bytes) fails where rank 0 makes the run directory while the
    other rank waits for it in a collective: the job ends in seconds with exit 2 and the line naming the path, where
    finalising MPI on rank 0 alone would hang it."""
    out = tmp_path / ("a" * 300)
    t0 = time.monotonic()
    proc = run_mpi(2, ["sweep", "--out", str(out), "--ops", "pingpong", "--sizes", "8", *FAST], timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "commcal: error: " in proc.stderr and "File name too long" in proc.stderr, proc.stderr[-2000:]
    assert time.monotonic() - t0 < 60
