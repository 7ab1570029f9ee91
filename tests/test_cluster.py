"""The local cluster for real: network namespaces with a tbf-limited link, real Slurm daemons,
`sbatch slurm/sweep.sh` end to end (sweep -> fit -> report -> calibration file), and a plain-MPI
sweep across the two "nodes". The inter-node bandwidth the calibration reports must recover the
injected tbf rate's payload share.

Needs root, iproute2, and Debian's munge/slurmctld/slurmd/slurm-client/libpmix packages (as
`./bootstrap.sh test` installs); without them the tier skips with the reason."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from analysis.attribution import OFF_PRICE
from calib.points import load_runs
from benchmarks import validate as bench_validate
from conftest import REPO, VENV_BIN, run_cli
from repeats import ACCURACY_MARGIN, RANK_MARGIN, Validates
from test_pipeline import FAST as TRAINING_FAST
from test_pipeline import MODEL as TRAINING_MODEL
from microbench import memcopy
from microbench.provenance import STEAL_WARN
from microbench.records import read_run_json

pytestmark = pytest.mark.cluster

CLUSTER = REPO / "slurm" / "cluster.sh"
SWEEP = REPO / "slurm" / "sweep.sh"
RATE_MBIT = 400
# tbf counts whole Ethernet frames (1514 bytes for a 1500-byte MTU) of which TCP carries 1448
# bytes of payload (20 IP + 20 TCP + 12 timestamp option bytes, 14 Ethernet header bytes).
EXPECTED_BPS = RATE_MBIT * 1e6 / 8 * 1448 / 1514
NODES = ("node1", "node2")
OWNER = Path("/run/commcal-cluster.dir")  # where cluster.sh notes the state directory of the cluster that is up
HOLDER = "pytest.pid"  # beside a test cluster's state directory: the test run that brought it up


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "not root: the local cluster needs network namespaces and tc"
    for tool in ("ip", "tc", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"no '{tool}' (apt-get install iproute2 util-linux)"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "'ip netns' does not work here"
    for tool in ("munged", "mungekey", "slurmctld", "slurmd", "sbatch"):
        if shutil.which(tool) is None:
            return f"no '{tool}' (./bootstrap.sh test installs munge slurmctld slurmd slurm-client libpmix2 libpmix-dev)"
    return None


def cluster_env(state: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["COMMCAL_CLUSTER_DIR"] = str(state)
    env["PYTHONUNBUFFERED"] = "1"
    for var in list(env):  # a test run inside someone's Slurm job must not leak its job into ours
        if var.startswith("SLURM_") or var.startswith("COMMCAL_") and var != "COMMCAL_CLUSTER_DIR":
            del env[var]
    return env


class Cluster:
    def __init__(self, state: Path, work: Path):
        self.state, self.work = state, work
        self.env = cluster_env(state)

    def run(self, *args: str, timeout: float = 120, env: dict | None = None, cwd: Path | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(CLUSTER), *args], env={**self.env, **(env or {})}, cwd=cwd or self.work,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"cluster.sh {' '.join(args)}: exit {proc.returncode}\n"
                                 f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        return proc

    def sbatch(self, *args: str, env: dict | None = None, cwd: Path | None = None) -> int:
        out = self.run("sbatch", "--parsable", *args, env=env, cwd=cwd).stdout.strip()
        assert re.fullmatch(r"\d+(;\S+)?", out), out
        return int(out.split(";")[0])

    def wait(self, job: int, timeout: float) -> tuple[bool, str]:
        proc = self.run("wait", str(job), str(int(timeout)), timeout=timeout + 30, check=False)
        return proc.returncode == 0, proc.stdout + proc.stderr

    def logs(self) -> str:
        parts = []
        for f in sorted((self.state / "log").glob("*.log")):
            parts.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(parts)


def _left_by_a_dead_run() -> Path | None:
    """The state directory of the cluster that is up when a test run brought it up and was killed before bringing
    it down (its pytest process is gone), else None: a cluster someone is using is never touched."""
    try:
        state = Path(OWNER.read_text().strip())
        pid = int((state.parent / HOLDER).read_text())
    except (OSError, ValueError):
        return None
    try:
        alive = "pytest" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        alive = False
    return None if alive else state


def stolen_share(run: dict) -> float:
    """The largest share of a node's CPU the hypervisor took while a sweep ran (its run.json's cpu_steal; 0 unknown)."""
    return max((f for f in (run.get("cpu_steal") or {}).values() if isinstance(f, (int, float))), default=0.0)


@contextmanager
def brought_up(tmp_path_factory, name: str, *up: str):
    """A local cluster (`cluster.sh up` with these arguments, state in a fresh directory), brought down however the
    block ends; skips where the cluster cannot run."""
    why = _missing()
    if why:
        pytest.skip(why)
    base = tmp_path_factory.mktemp(name)
    c = Cluster(base / "state", base / "work")
    c.work.mkdir()
    (base / HOLDER).write_text(str(os.getpid()))
    if subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.count("commcal-ctl"):
        left = _left_by_a_dead_run()
        if left is None:
            pytest.fail("a local cluster is already up (namespace commcal-ctl); run slurm/cluster.sh down first")
        print(f"bringing down a cluster a killed test run left up ({left})")
        subprocess.run([str(CLUSTER), "down"], env=cluster_env(left), capture_output=True, text=True, timeout=120)
    try:
        t0 = time.monotonic()
        c.run("up", *up, timeout=90)
        print(f"{name} up in {time.monotonic() - t0:.1f} s")
        yield c
    finally:
        subprocess.run([str(CLUSTER), "down"], env=c.env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with brought_up(tmp_path_factory, "cluster", "--nodes", "2", "--rate", f"{RATE_MBIT}mbit", "--cpus", "2") as c:
        yield c


def test_nodes_have_their_own_hostnames_and_addresses(cluster):
    for i, node in enumerate(NODES, start=1):
        assert cluster.run("exec", node, "hostname").stdout.strip() == node
        addrs = cluster.run("exec", node, "ip", "-4", "-o", "addr", "show", "dev", "eth0").stdout
        assert f"10.77.0.{i}/24" in addrs
        qdisc = cluster.run("exec", node, "tc", "qdisc", "show", "dev", "eth0").stdout
        assert "tbf" in qdisc and "400Mbit" in qdisc, qdisc
        # TCP as a new node's kernel has it (slow start after idle time); only `up --tcp-keep-cwnd` tunes it
        idle = cluster.run("exec", node, "cat", "/proc/sys/net/ipv4/tcp_slow_start_after_idle").stdout.strip()
        assert idle == "1", idle
    # the root namespace cannot reach the cluster's subnet: traffic never leaves the machine
    route = subprocess.run(["ip", "route", "get", "10.77.0.1"], capture_output=True, text=True)
    assert route.returncode != 0 or "unreachable" in route.stdout
    # a second `up` refuses and leaves the running cluster alone
    again = cluster.run("up", check=False)
    assert again.returncode != 0 and "already up" in again.stderr, again
    status = cluster.run("status").stdout
    assert "slurmctld: running" in status and "slurmd-node2: running" in status, status


def test_srun_and_sbatch_reach_both_nodes(cluster):
    out = cluster.run("srun", "-N2", "-n2", "hostname", timeout=60).stdout.split()
    assert sorted(out) == list(NODES)
    # the generated wrappers work from the host side as plain commands: eval "$(cluster.sh env)"
    exports = dict(re.findall(r"^export (\w+)=(.*)$", cluster.run("env").stdout, re.M))
    env = {**cluster.env, "SLURM_CONF": exports["SLURM_CONF"],
           "PATH": exports["PATH"].replace("$PATH", cluster.env["PATH"])}
    wrapper = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=env, capture_output=True, text=True,
                             timeout=60)
    assert wrapper.returncode == 0 and sorted(wrapper.stdout.split()) == ["idle", "idle", *NODES], wrapper
    job = cluster.sbatch("-N2", "--ntasks-per-node=1", "-o", "hello-%j.out", "--wrap", "srun hostname")
    t0 = time.monotonic()
    ok, text = cluster.wait(job, 60)
    assert ok, text + cluster.logs()
    assert time.monotonic() - t0 < 20, "a trivial job should finish within seconds (no sbatch --wait polling)"
    assert sorted((cluster.work / f"hello-{job}.out").read_text().split()) == list(NODES)
    # a failing job is reported as such
    job = cluster.sbatch("-N1", "-o", "false-%j.out", "--wrap", "false")
    ok, text = cluster.wait(job, 60)
    assert not ok and "FAILED" in text, text


def test_sweep_sh_fails_loudly_when_world_is_not_the_task_count(cluster):
    # srun --mpi=none makes Open MPI start separate size-1 worlds: the job must fail, not calibrate.
    env = {"COMMCAL_SRUN_MPI": "none", "COMMCAL_PRESET": "quick", "COMMCAL_OPS": "pingpong",
           "COMMCAL_SIZES": "8,64", "COMMCAL_OUT_DIR": str(cluster.work / "mismatch")}
    job = cluster.sbatch("-o", "mismatch-%j.out", str(SWEEP), env=env)
    ok, text = cluster.wait(job, 120)
    log = (cluster.work / f"mismatch-{job}.out").read_text()
    assert not ok, f"{text}\n{log}"
    assert "commcal-sweep: FAILED" in log, log
    assert re.search(r"MPI world has 1 ranks but Slurm started 4 tasks", log), log
    assert not list((cluster.work / "mismatch").glob("*.json")), "no calibration may be written"


SWEEP_ENV = {"COMMCAL_PRESET": "quick", "COMMCAL_LINKS": "intra,inter",
             "COMMCAL_OPS": "pingpong,sendrecv,allreduce,allgather,reduce_scatter,alltoall,gemm",
             # large sizes so that the inter-node beta is fitted where the tbf rate dominates, and 128 KiB so that the
             # after-compute all-reduce's 256 KiB regime need not share the 1-4 MiB segment (docs/results.md, "128 KiB
             # in the tier's grid"); 64 KiB, still inside the token bucket's burst, would start the ping-pong's top
             # segment and tilt its bandwidth
             "COMMCAL_SIZES": "8,512,4K,32K,128K,256K,512K,1M,2M,3M,4M"}
# The sweep's own --retries (1): a point whose CI misses the target is measured once more later. The robust fit
# needs no second retry (docs/results.md, "The cluster tests on the default retries").


@dataclass(frozen=True)
class ResumedSweep:
    """An sbatch sweep killed part-way and resubmitted: what the kill left and what the resumption did."""

    out: Path
    kept: dict[str, tuple[int, int]]  # point file -> (mtime_ns, rounds) after the kill
    first_log: str
    log: str

    @property
    def calibration(self) -> Path:
        cals = sorted(self.out.glob("localcluster-*.json"))
        assert len(cals) == 1, cals
        return cals[0]


@pytest.fixture(scope="module")
def resumed_sweep(cluster) -> ResumedSweep:
    """`sbatch slurm/sweep.sh` killed part-way as a time limit would, then resubmitted (each test that needs
    this module's calibration depends on this fixture, not on another test)."""
    out = cluster.work / "calib"
    env = {**SWEEP_ENV, "COMMCAL_OUT_DIR": str(out), "COMMCAL_RUN_NAME": "run"}
    points = out / "run" / "points"
    job = cluster.sbatch("-o", "sweep-%j.out", str(SWEEP), env=env)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(list(points.glob("*.json"))) < 6:
        time.sleep(0.2)
    cluster.run("scancel", str(job))
    ok, text = cluster.wait(job, 120)
    first_log = (cluster.work / f"sweep-{job}.out").read_text()
    assert not ok, f"the first job should have been cancelled part-way:\n{text}\n{first_log}"
    kept = {p.name: (p.stat().st_mtime_ns, json.loads(p.read_text())["rounds"]) for p in points.glob("*.json")}
    t0 = time.monotonic()
    job = cluster.sbatch("-o", "sweep-%j.out", str(SWEEP), env=env)
    ok, text = cluster.wait(job, 600)
    log = (cluster.work / f"sweep-{job}.out").read_text()
    assert ok, f"{text}\n{log}\n{cluster.logs()}"
    print(f"resumed sweep job: {time.monotonic() - t0:.1f} s")
    return ResumedSweep(out, kept, first_log, log)


def test_sbatch_sweep_sh_calibrates_the_injected_bandwidth_and_resumes(resumed_sweep):
    out, kept, log = resumed_sweep.out, resumed_sweep.kept, resumed_sweep.log
    points = out / "run" / "points"
    assert len(kept) >= 6, f"measured points must survive the kill:\n{resumed_sweep.first_log}"
    finished = {name for name, (_, rounds) in kept.items() if rounds == 3}
    assert f"({len(finished)} already done, {len(kept) - len(finished)} partly)" in log, log
    for name, (mtime, _) in kept.items():
        if name in finished:
            assert (points / name).stat().st_mtime_ns == mtime, f"{name} was measured again"
        else:
            assert json.loads((points / name).read_text())["rounds"] >= 3, f"{name} was not finished"
    run = json.loads((out / "run" / "run.json").read_text())
    assert run["resumed_at"], "run.json should record the resumption"
    # sweep.sh measures every point in two MPI launches at least, and the calibration records it
    assert (pd.read_csv(out / "run" / "summary.csv")["launches"] >= 2).all()
    assert sorted(run["hosts"]) == list(NODES)
    # 3. the calibration file: named after the cluster and date, valid, with both link classes
    cal_path = resumed_sweep.calibration
    assert re.fullmatch(r"localcluster-\d{4}-\d{2}-\d{2}\.json", cal_path.name), cal_path
    from calib.calibration import load_calibration

    cal = load_calibration(cal_path)
    assert {"intra", "inter"} <= set(cal.link_classes())
    data = json.loads(cal_path.read_text())
    assert data["provenance"]["runs"][0]["launches"] >= 3 and data["provenance"]["runs"][0]["preset"] == "quick"
    assert data["models"]["pingpong"]["inter"]["launch_spread"]["launches"] >= 2
    # the default path's second sweep: the after-compute models, measured in two launches as well
    after = data["after_compute"]
    assert after["after_gemm"] == 384 and {"intra", "inter"} <= set(after["models"]["allreduce"])
    runs = data["provenance"]["runs"]
    assert [r["after_gemm"] for r in runs] == [0, 384] and runs[1]["launches"] >= 2
    assert data["link_classes"]["inter"]["nodes"] == 2 and data["link_classes"]["intra"]["nodes"] == 1
    # 4. the job ended with its report
    assert (cal_path.parent / f"{cal_path.stem}-report" / "report.html").is_file(), log
    # 5. ground truth: the inter-node point-to-point bandwidth is the tbf rate's payload share, on hosts that ran it
    stolen = stolen_share(run)
    if stolen > STEAL_WARN:
        assert any("cpu_steal" in w for w in data["warnings"]), data["warnings"]     # the fit says so
        pytest.skip(f"the hypervisor took {stolen:.0%} of a node's CPU while the sweep ran (run.json cpu_steal): "
                    f"the fit warned, and a bandwidth measured under steal does not judge the link")
    bw = data["p2p"]["pingpong"]["inter"]["bandwidth_bytes_per_s"]
    intra = data["p2p"]["pingpong"]["intra"]["bandwidth_bytes_per_s"]
    print(f"inter-node pingpong bandwidth {bw / 1e6:.2f} MB/s, expected {EXPECTED_BPS / 1e6:.2f} MB/s "
          f"({bw / EXPECTED_BPS - 1:+.1%}); intra-node {intra / 1e6:.0f} MB/s")
    pp = pd.read_csv(out / "run" / "summary.csv").query("op == 'pingpong' and link == 'inter'")
    table = pp.sort_values("size_bytes")[["size_bytes", "samples", "median_s", "ci_low_s", "ci_high_s", "min_s"]]
    assert abs(bw / EXPECTED_BPS - 1) <= 0.05, f"{bw=} {EXPECTED_BPS=}\n{table.to_string()}\n{log}"
    # and what a planner asks the calibration: an 8 MiB message between nodes moves at that rate
    pred = run_cli(["predict", str(cal_path), "--op", "pingpong", "--link", "inter", "--procs", "2", "--bytes", "8M",
                    "--json"])
    assert pred.returncode == 0, pred.stdout + pred.stderr
    seconds = json.loads(pred.stdout)["seconds"]
    assert abs((8 << 20) / seconds / EXPECTED_BPS - 1) <= 0.05, (seconds, pred.stdout)
    assert intra > 2 * bw, "shared memory within a node should beat the rate-limited link"


@pytest.fixture(scope="module")
def validates(cluster, resumed_sweep) -> Validates:
    metrics, tables = [], []
    for i in (1, 2):
        out = cluster.work / f"validate-{i}"
        env = {"COMMCAL_CALIBRATION": str(resumed_sweep.calibration), "COMMCAL_VALIDATE_OUT": str(out),
               "COMMCAL_PRESET": "quick", "COMMCAL_VALIDATE_ARGS": "--mesh 2x2"}
        t0 = time.monotonic()
        job = cluster.sbatch("-o", f"validate-{i}-%j.out", str(REPO / "slurm" / "validate.sh"), env=env)
        ok, text = cluster.wait(job, 300)
        log = (cluster.work / f"validate-{i}-{job}.out").read_text()
        assert ok, f"{text}\n{log}\n{cluster.logs()}"
        print(f"validate.sh quick: {time.monotonic() - t0:.1f} s")
        summary = json.loads((out / "summary.json").read_text())
        strategies = pd.read_csv(out / "strategies.csv")
        assert len(strategies) >= 10 and (strategies.measured_s > 0).all()
        assert {"kendall_tau", "comm_kendall_tau", "regret", "mean_accuracy"} <= set(summary["metrics"])
        run = json.loads((out / "run.json").read_text())
        assert sorted(set(run.get("hosts", []))) == list(NODES), run.get("hosts")
        metrics.append(summary["metrics"])
        tables.append(pd.read_parquet(out / "strategies.parquet"))
    return Validates(metrics, tables)


@pytest.mark.long
@pytest.mark.xfail(reason="issue 29/31: on a quiet host two quick 2x2 validates rank alike (comm tau 0.90-0.99) while the "
                          "calibration reaches 0.62-0.84, its intra-node steps 3-34x their price where 4 ranks "
                          "time-share the host's fewer cores", strict=False)
def test_sbatch_validate_sh_quick_ranks_2x2_strategies_as_well_as_a_second_validate(validates):
    """slurm/validate.sh on a 2x2 mesh (inter x intra): the sweep's calibration ranks each validate's strategies by
    communication nearly as well as the other validate does."""
    lines = validates.against_repeat("comm_kendall_tau", RANK_MARGIN)
    assert not any(line.endswith("MISSED") for line in lines), "\n".join(lines)


@pytest.mark.long
@pytest.mark.xfail(reason="issue 31: on the default path, 2x2 intra-node steps measure several times their price "
                          "on a host whose 4 ranks time-share 2 CPUs", strict=False)
def test_sbatch_validate_sh_quick_prices_2x2_strategies_as_well_as_a_second_validate(validates):
    """The calibration's comm mean accuracy on each validate is within 0.10 of the other validate's."""
    lines = validates.against_repeat("comm_mean_accuracy", 0.10)
    assert not any(line.endswith("MISSED") for line in lines), "\n".join(lines)


@dataclass(frozen=True)
class Control:
    """bench_validate's two quick validates on the inter-node control, with the default path's calibration."""

    validates: Validates
    stdout: str
    runs: list[Path]             # the two validates' directories
    sweeps: dict[bool, Path]     # after compute? -> the sweep run its models were fitted from
    calibration: Path

    def faster(self) -> int:
        """The validate whose launch ran the communication faster (the sum of its strategies' measured comm times,
        over the strategies both ran): timing noise and TCP's slow modes only add time, so the faster launch is
        the one nearer the speeds a calibration prices; the other may have drawn slow modes in some steps or, in
        about one launch of twenty, in every step (each exchange 2-4x its price)."""
        comm = [t.set_index(["layer", "strategy"])["measured_comm_s"] for t in self.validates.tables]
        both = comm[0].index.intersection(comm[1].index)
        return int(comm[1][both].sum() < comm[0][both].sum())

    def misses(self, name: str, margin: float) -> list[str]:
        """Where the faster validate's `name` misses bench_validate's target and, by more than `margin`, what the
        other validate scores as its prediction (Validates.against_repeat): a miss that is the calibration's. The
        slower validate's line is printed, not judged: between two predictions of a launch that drew slow modes,
        which is nearer is chance."""
        a = self.faster()
        op, target = next((op, t) for n, op, t in bench_validate.TARGETS if n == name)
        value = self.validates.metrics[a][name]["value"]
        line = self.validates.against_repeat(name, margin)[a]
        print(f"judged: validate {a + 1}, the faster launch")
        met = value >= target if op == ">=" else value <= target
        return [f"{line} (target {op} {target})"] if line.endswith("MISSED") and not met else []

    def step_ratios(self, a: int) -> list[dict]:
        """Validate a's measured / predicted time per collective and link, as validate stored it in summary.json
        (analysis.attribution.step_ratios, with the calibration's recorded slow speeds)."""
        return json.loads((self.runs[a] / "summary.json").read_text()).get("step_ratios", [])

    def unnamed_off_price(self, a: int) -> list[str]:
        """The collectives of validate a whose steps validate's own verdict (analysis.attribution.verdict) finds off
        their price and at no slow speed the calibration records: a launch that drew a slow speed the calibration
        names is not a pricing error; a step faster than its price, or slower at no recorded speed, is."""
        return [f"{r['op']}/{r['link']} {r['median']:.3f}x its price, {r['verdict']}" + (
                    f" (slowest speed recorded {r['sweep_slow_ratio']:.3f}x)" if "sweep_slow_ratio" in r else "")
                for r in self.step_ratios(a) if r["verdict"] in ("slower", "faster")]

    def evidence(self) -> str:
        """Where a miss came from, for its failure message: each operation whose steps ran more than OFF_PRICE off
        their price in a validate, those steps, and the sweep points and segments of the models that priced them."""
        off = sorted({(row["op"], row["link"]) for a in range(len(self.runs)) for row in self.step_ratios(a)
                      if row["verdict"] != "priced"})
        if not off:
            return f"no operation's steps ran more than {OFF_PRICE:.0%} off their price (median over a validate)"
        steps = pd.concat([pd.read_parquet(r / "steps.parquet").assign(validate=r.name) for r in self.runs])
        cal = json.loads(self.calibration.read_text())
        lines = []
        for op, link in off:
            mine = steps[(steps["op"] == op) & (steps["link"] == link) & (steps["predicted_s"] > 0)]
            lines.append(f"{op}/{link} steps, measured / predicted:")
            lines += [f"  {r.validate} {r.layer} {r.strategy} {r.size_bytes} B{' after compute' * r.after_compute}: "
                      f"{r.measured_s / r.predicted_s:.3f}" for r in mine.itertuples()]
            for after in sorted(set(mine["after_compute"])):
                models = cal["after_compute"]["models"] if after else cal["models"]
                lines += model_points(self.sweeps[bool(after)], op, link, models[op][link])
        return "\n".join(lines)


def model_points(run: Path, op: str, link: str, model: dict) -> list[str]:
    """A model's sweep points (each price, its calls and their quantiles over it) and its fitted segments, as lines for
    a failure message: where a missed price came from."""
    pts = load_runs([str(run)]).points
    pts = pts[(pts["op"] == op) & (pts["link"] == link)].sort_values("size_bytes")
    samples = pd.read_parquet(run / "samples.parquet", columns=["point_id", "time_s"])
    lines = [f"{op}/{link} points of {run.name} (calls over the price: min, quartiles, max):"]
    for r in pts.itertuples():
        q = (samples.loc[samples["point_id"] == r.point_id, "time_s"] / r.seconds).quantile([0, .25, .5, .75, 1])
        lines.append(f"  {r.size_bytes:>8} B  {r.seconds * 1e3:9.4f} ms  {r.n_samples:>4} calls  "
                     + " ".join(f"{v:.2f}" for v in q))
    return lines + [f"  segment {g['min_bytes']:g}..{g['max_bytes']:g} B: alpha {g['alpha_s']:.4g} s, "
                    f"{1 / g['beta_s_per_byte'] / 1e6 if g['beta_s_per_byte'] > 0 else float('nan'):.2f} MB/s"
                    for g in model["segments"]]


@pytest.fixture(scope="module")
def control(cluster, resumed_sweep) -> Control:
    """The headline claim's measurement where the link holds still (one rank per node, mesh 2): the default path's
    calibration (`sbatch slurm/sweep.sh`, resumed_sweep) and two quick validates of bench_validate's layers."""
    out = cluster.work / "control"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "benchmarks.validate", "--launch",
                           f"{CLUSTER} mpirun -n 2 --map-by node", "--calibration", str(resumed_sweep.calibration),
                           "--mesh", "2", "--validate-args=--quick", "--repeat", "2", "--out", str(out)],
                          env=cluster.env, cwd=REPO, capture_output=True, text=True, timeout=900)
    print(f"inter-node control bench_validate: {time.monotonic() - t0:.0f} s")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    print("\n".join(line for line in proc.stdout.splitlines() if line.startswith("comm_")))
    runs = [out / "validate", out / "validate-2"]
    sweeps = {False: resumed_sweep.out / "run", True: next(resumed_sweep.out.glob("run-after-gemm*"))}
    return Control(Validates([json.loads((r / "summary.json").read_text())["metrics"] for r in runs],
                             [pd.read_parquet(r / "strategies.parquet") for r in runs]), proc.stdout, runs, sweeps,
                   resumed_sweep.calibration)


def test_inter_node_control_prices_strategies_within_the_targets(control):
    """The headline claim on the control, asserted: on the faster of two validates (Control.faster) the calibration
    meets bench_validate's comm mean accuracy target (>= 0.95), or prices it nearly as well as the other validate
    does (ACCURACY_MARGIN), or its steps ran at the price but where they drew a slow speed the calibration records
    (Control.unnamed_off_price): both launches can draw the slow all-reduce the calibration prices the fast speed
    of, and then the other validate predicts it better than any one price can."""
    low = control.misses("comm_mean_accuracy", ACCURACY_MARGIN)
    off = control.unnamed_off_price(control.faster()) if low else []
    if low and not off:
        print(f"{low[0]}: every step off its price ran at a slow speed the calibration records")
    assert not (low and off), f"{low}; off their price: {off}\n{control.stdout[-3000:]}\n{control.evidence()}"


def test_inter_node_control_picks_strategies_within_the_regret_target(control):
    """The control's choice, asserted: on the faster validate (Control.faster) the strategy the calibration prices
    fastest in each layer runs within bench_validate's comm regret target (<= 3%) of the fastest measured, or the
    calibration picks as well as the other validate does (no margin). A swap of two strategies a few percent apart
    costs less than the target; a calibration that prices a layer the wrong way round by more does not."""
    low = control.misses("comm_regret", 0.0)
    assert not low, f"{low}\n{control.stdout[-3000:]}\n{control.evidence()}"


@pytest.mark.xfail(reason="issue 29/31: every tau miss of 2026-11-27/28 but one (mended by the fit's segment-count "
                          "check) was a near-tie: m against -/ws, measured 0.9% apart in the linear layer and 2.2% in the "
                          "MLP's. Since -/ws's opening all-gather is priced after compute, the calibration prices the "
                          "pairs as far apart as they run (within 0.3 points, two runs of 2026-11-28 evening), but a "
                          "calibration's error of about 1% on the after-compute all-reduce can still swap the linear "
                          "pair: too fragile to assert; the next test asserts the pairs measured apart (docs/results.md, "
                          "\"Verdicts per collective, and the step's opening all-gather priced after compute\")",
                   strict=False)
def test_inter_node_control_ranks_strategies_within_the_targets(control):
    """The control's ranking: on the faster validate (Control.faster) the calibration's comm Kendall tau meets
    bench_validate's target (>= 0.9) or ranks nearly as well as the other validate does (RANK_MARGIN): a layer of
    three strategies, two of them within 1.3% of each other, has a tau of 1/3 whenever that pair swaps."""
    low = control.misses("comm_kendall_tau", RANK_MARGIN)
    assert not low, f"{low}\n{control.stdout[-3000:]}\n{control.evidence()}"


def test_inter_node_control_ranks_the_strategies_measured_apart_within_the_target(control):
    """The control's ranking of the pairs its measurement resolves: on the faster validate the calibration's comm
    resolved tau (Kendall's tau over the strategy pairs measured more than analysis.ranking.RESOLUTION apart, the
    regret target's tolerance) meets the tau target (>= 0.9), or ranks them nearly as well as the other validate does
    (RANK_MARGIN). A swap of m and -/ws (measured 0.9-2.2% apart) is left out; a swap of strategies measured further
    apart is the calibration's."""
    low = control.misses("comm_resolved_tau", RANK_MARGIN)
    assert not low, f"{low}\n{control.stdout[-3000:]}\n{control.evidence()}"


def test_validate_training_runs_pipeline_stages_across_the_nodes(cluster, resumed_sweep):
    """2 nodes x 2 ranks on the default path's calibration: `validate --training` runs pipeline stages on both nodes
    (activations and gradients crossing the link), tensor and data parallelism and ZeRO 1, its numerics checked
    against one process, and every configuration measured."""
    out = cluster.work / "training"
    configs = ["t=1,p=4,d=1,mb=2", "t=2,p=2,d=1,mb=2", "t=1,p=2,d=2,mb=2,zero=1"]
    proc = cluster.run("mpirun", "-n", "4", "--host", "node1:2,node2:2", str(VENV_BIN / "commcal"), "validate",
                       str(resumed_sweep.calibration), "--training", TRAINING_MODEL, "--out", str(out), *TRAINING_FAST,
                       *[a for c in configs for a in ("--config", c)], timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "numerics ok for all 3 configurations" in proc.stdout, proc.stdout[-3000:]
    frame = pd.read_parquet(out / "strategies.parquet")
    assert sorted(zip(frame["t"], frame["p"], frame["d"])) == [(1, 2, 2), (1, 4, 1), (2, 2, 1)]
    assert (frame["measured_s"] > 0).all() and frame.loc[frame["p"] > 1, "measured_wait_s"].gt(0).all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["hosts"] == 2 and summary["world_size"] == 4


@pytest.mark.long
@pytest.mark.xfail(reason="issues 31/32: two runs rank the mixes alike (tau 0.95) while the calibration reached 0.78-0.79 "
                          "in one of two fresh-clone CI runs: tensor-parallel all-reduces measured 36-38x their price and "
                          "compute 5x with 4 ranks time-sharing the host's fewer cores", strict=False)
def test_pipeline_validation_ranks_training_mixes_as_well_as_a_second_run(cluster):
    """2 nodes x 2 ranks: benchmarks.pipeline sweeps, fits and runs `validate --training` twice: pipeline stages on
    ranks of both nodes exchanging activations and gradients in 1F1B and interleaved orders, tensor and data
    parallelism and ZeRO 1, every (p, t, d) of 4 ranks, numerics checked against one process. The calibration ranks
    each run's configurations end to end nearly as well as the other run does (Kendall tau within RANK_MARGIN)."""
    out = cluster.work / "pipeline"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "benchmarks.pipeline", "--launch",
                           f"{CLUSTER} mpirun -n 4 --host node1:2,node2:2", "--validate-args=--quick", "--out", str(out)],
                          env=cluster.env, cwd=REPO, capture_output=True, text=True, timeout=1500)
    steps = [m.group(1) for m in re.finditer(r"^  \((\d+ s)\)$", proc.stdout, re.M)]
    print(f"pipeline bench: {time.monotonic() - t0:.0f} s (steps: {', '.join(steps)})")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    print("\n".join(line for line in proc.stdout.splitlines() if line.split(" ")[0] in (
        "kendall_tau", "regret", "top1", "mean_accuracy")))
    runs = [out / "validate", out / "validate-2"]
    summaries = [json.loads((r / "summary.json").read_text()) for r in runs]
    validates = Validates([s["metrics"] for s in summaries], [pd.read_parquet(r / "strategies.parquet") for r in runs])
    for s, table in zip(summaries, validates.tables):
        assert s["hosts"] == 2 and s["world_size"] == 4
        assert {(p, t, d) for p, t, d in zip(table["p"], table["t"], table["d"])} == {
            (4, 1, 1), (2, 1, 2), (2, 2, 1), (1, 2, 2), (1, 4, 1), (1, 1, 4)}
    lines = validates.against_repeat("kendall_tau", RANK_MARGIN)
    assert not any(line.endswith("MISSED") for line in lines), "\n".join(lines) + "\n" + proc.stdout[-3000:]


def test_sbatch_sweep_sh_after_gemm_fits_the_after_compute_models_in_the_chdir(cluster):
    """COMMCAL_AFTER_GEMM: a second sweep with a GEMM before each call, fitted as the after-compute models; the
    job is submitted with sbatch --chdir, so its output and results land there, not in the submit directory."""
    work = cluster.work / "after-chdir"
    work.mkdir()
    out = work / "commcal-out"
    env = {"COMMCAL_PRESET": "quick", "COMMCAL_LINKS": "intra", "COMMCAL_OPS": "allreduce",
           "COMMCAL_SIZES": "1K,4K,16K,64K,256K,1M", "COMMCAL_RUN_NAME": "run",
           "COMMCAL_AFTER_GEMM": "96", "COMMCAL_REPORT": "0"}
    job = cluster.sbatch(f"--chdir={work}", "-o", "after-%j.out", str(SWEEP), env=env)
    ok, text = cluster.wait(job, 300)
    assert (work / f"after-{job}.out").is_file(), f"the job's output belongs in --chdir:\n{text}"
    log = (work / f"after-{job}.out").read_text()
    assert ok, f"{text}\n{log}\n{cluster.logs()}"
    assert not (cluster.work / "commcal-out").exists(), "results belong in --chdir, not the submit directory"
    assert json.loads((out / "run-after-gemm96" / "run.json").read_text())["options"]["after_gemm"] == 96
    data = json.loads(next(out.glob("localcluster-*.json")).read_text())
    assert data["after_compute"]["after_gemm"] == 96 and "intra" in data["after_compute"]["models"]["allreduce"]
    assert "intra" in data["models"]["allreduce"] and len(data["provenance"]["runs"]) == 2
    bad = cluster.sbatch("-o", "after-bad-%j.out", str(SWEEP), env={**env, "COMMCAL_AFTER_GEMM": "lots"})
    ok, text = cluster.wait(bad, 60)
    assert not ok and "COMMCAL_AFTER_GEMM must be a whole number" in (cluster.work / f"after-bad-{bad}.out").read_text()


def test_time_limit_kill_keeps_points_and_resubmission_resumes(cluster):
    # a full-size sweep cannot finish in sbatch's smallest time limit (1 minute)
    env = {"COMMCAL_OPS": "allreduce,pingpong", "COMMCAL_OUT_DIR": str(cluster.work / "timelimit"),
           "COMMCAL_RUN_NAME": "run", "COMMCAL_REPORT": "0"}
    points = cluster.work / "timelimit" / "run" / "points"
    job = cluster.sbatch("-t", "1", "-o", "tl-%j.out", str(SWEEP), env=env)
    ok, text = cluster.wait(job, 180)
    log = (cluster.work / f"tl-{job}.out").read_text()
    assert not ok and "TIMEOUT" in text, f"{text}\n{log}"
    assert "commcal-sweep: FAILED: terminated" in log, log
    kept = len(list(points.glob("*.json")))
    assert kept >= 5, f"finished points must survive the time limit:\n{log}"
    job = cluster.sbatch("-t", "5", "-o", "tl-%j.out", str(SWEEP), env=env)
    log_path = cluster.work / f"tl-{job}.out"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "already done" not in (log_path.read_text() if log_path.exists() else ""):
        time.sleep(0.2)
    cluster.run("scancel", str(job))
    cluster.wait(job, 60)
    m = re.search(r"(\d+) points \((\d+) already done, (\d+) partly\)", log_path.read_text())
    assert m and int(m.group(2)) + int(m.group(3)) >= kept, log_path.read_text()


def test_sbatch_sweep_sh_after_a_finished_job_measures_a_new_run_and_keeps_the_first_calibration(cluster):
    """The default path run again (next week, say) with the same settings: the finished run is not resumed and
    refitted into a calibration of stale measurements, but a new run (RUN-2) is measured, and the first job's
    calibration is not overwritten (a -2 name beside it); its run is left as it was."""
    out = cluster.work / "again"
    env = {"COMMCAL_PRESET": "quick", "COMMCAL_OPS": "pingpong", "COMMCAL_SIZES": "4K,16K,64K,256K",
           "COMMCAL_LINKS": "intra", "COMMCAL_OUT_DIR": str(out), "COMMCAL_AFTER_GEMM": "0",
           "COMMCAL_REPORT": "0", "COMMCAL_ROUNDS": "1", "COMMCAL_LAUNCHES": "1"}
    first = cluster.sbatch("-o", "again-%j.out", str(SWEEP), env=env)
    ok, text = cluster.wait(first, 240)
    assert ok, f"{text}\n{(cluster.work / f'again-{first}.out').read_text()}"
    (run,) = out.glob("sweep-*")
    cal = next(out.glob("localcluster-*.json"))
    before = cal.read_bytes(), (run / "summary.csv").stat().st_mtime_ns
    second = cluster.sbatch("-o", "again-%j.out", str(SWEEP), env=env)
    ok, text = cluster.wait(second, 240)
    log = (cluster.work / f"again-{second}.out").read_text()
    assert ok, f"{text}\n{log}"
    assert sorted(p.name for p in out.glob("sweep-*")) == [run.name, f"{run.name}-2"], log
    assert f"run directory {run}-2" in log and "(0 already done, 0 partly)" in log, log
    cals = sorted(out.glob("localcluster-*.json"))
    assert len(cals) == 2 and (cal.read_bytes(), (run / "summary.csv").stat().st_mtime_ns) == before, cals
    newer = json.loads(next(c for c in cals if c != cal).read_text())
    assert newer["provenance"]["runs"][0]["run_id"] == read_run_json(Path(f"{run}-2"))["run_id"] \
        != read_run_json(run)["run_id"]


def test_plain_mpirun_sweep_across_the_nodes(cluster):
    out = cluster.work / "plain"
    commcal = str(VENV_BIN / "commcal")
    proc = cluster.run("mpirun", "-n", "2", "--map-by", "node", commcal, "sweep", "--out", str(out), "--quick",
                       "--ops", "pingpong", "--links", "inter", "--sizes", "8,4K,256K,1M", "--expect-world", "2",
                       timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = json.loads((out / "run.json").read_text())
    assert sorted(run["hosts"]) == list(NODES), run["hosts"]
    # the cluster's memcpy tunable reaches the ranks, and there copies no longer depend on buffer placement
    assert run["environment"]["GLIBC_TUNABLES"] == memcopy.TUNABLE
    assert run["memcpy_alias_slowdown"] < memcopy.WARN_SLOWDOWN
    summary = (out / "summary.csv").read_text().splitlines()
    assert len(summary) == 1 + 4, summary
    # and the smoke program: two ranks on two nodes, exact data, bandwidth near the tbf rate
    proc = cluster.run("mpirun", "-n", "2", "--map-by", "node", sys.executable,
                       str(REPO / "slurm" / "localcluster" / "pingpong.py"), str(2 << 20), "6", timeout=120)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["hosts"] == list(NODES) and res["wrong"] == 0
    assert res["best_bandwidth_Bps"] < 1.05 * EXPECTED_BPS, res  # the tbf rate is a ceiling


def test_conv_validate_runs_paradls_strategies_across_the_nodes(cluster, resumed_sweep):
    """vgg-small whole under ParaDL's 2-d strategies on mesh 2x2 (axis 0 across the nodes, axis 1 within one), with
    the sbatch sweep's calibration (sendrecv prices the halo exchange): every strategy matches one process, the data
    axis's gradient allreduces cross the rate-limited link and data+spatial's halos stay within a node; the ParaDL
    table of predicted against measured is printed."""
    out = cluster.work / "conv"
    commcal = str(VENV_BIN / "commcal")
    t0 = time.monotonic()
    proc = cluster.run("mpirun", "-n", "4", "--host", "node1:2,node2:2", commcal, "validate",
                       str(resumed_sweep.calibration), "--model", "vgg-small", "--mesh", "2x2", "--quick",
                       "--out", str(out), timeout=600, check=False)
    print(f"conv validate: {time.monotonic() - t0:.0f} s")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    frame = pd.read_parquet(out / "strategies.parquet")
    assert list(frame["strategy"]) == ["data", "filter", "channel", "data+filter", "data+spatial"]
    assert (frame["max_rel_err"] <= 1e-4).all() and (frame["measured_s"] > 0).all()
    assert sorted(set(json.loads((out / "run.json").read_text())["hosts"])) == list(NODES)
    steps = pd.read_parquet(out / "steps.parquet")
    data_axis = steps[(steps["strategy"] == "data") & (steps["op"] == "allreduce") & (steps["axis"] == 0)]
    assert len(data_axis) and set(data_axis["link"]) == {"inter"}
    halos = steps[(steps["strategy"] == "data+spatial") & (steps["op"] == "sendrecv")]
    assert len(halos) and set(halos["link"]) == {"intra"} and set(halos["axis"]) == {1}
    for r in frame.itertuples():
        print(f"{r.strategy:<14} predicted {r.predicted_s * 1e3:8.3f} ms  measured {r.measured_s * 1e3:8.3f} ms  "
              f"accuracy {100 * r.accuracy:6.2f}%")


AFFINITY = ("import json, os, socket; from mpi4py import MPI; "
            "print(json.dumps([MPI.COMM_WORLD.rank, socket.gethostname(), sorted(os.sched_getaffinity(0))]))")


def test_mpirun_leaves_ranks_unbound_unless_asked_to_bind_them_to_cores(cluster):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("binding two ranks per node to cores needs two CPUs")
    cpus = sorted(os.sched_getaffinity(0))

    def placement(*bind: str) -> dict[str, list[list[int]]]:
        proc = cluster.run("mpirun", *bind, "-n", "4", "--host", "node1:2,node2:2", sys.executable, "-c", AFFINITY,
                           timeout=120)
        rows = sorted(json.loads(line) for line in proc.stdout.splitlines() if line.startswith("["))
        assert [r[0] for r in rows] == [0, 1, 2, 3], proc.stdout + proc.stderr
        return {node: [r[2] for r in rows if r[1] == node] for node in NODES}

    assert placement() == {node: [cpus, cpus] for node in NODES}
    # a node's k-th rank on the k-th core (the same on every node): the two ranks of a node never share one
    bound = placement("--bind-to", "core")
    first, second = bound["node1"]
    assert bound["node2"] == bound["node1"] and first and second and not set(first) & set(second), bound
    assert set(first) < set(cpus) and set(second) < set(cpus), bound


CAI_LAYER = (512, 512, 512)       # m, k, n of the Colossal-AI validates: W blocks of 256 KiB, 4 times tbf's burst
BURST = 64 << 10                  # slurm/cluster.sh's tbf burst: that much may leave a node above the rate


@pytest.fixture(scope="module")
def cai_calibration(cluster) -> Path:
    """A calibration of the collectives Colossal-AI's 2D and 2.5D layers and 2D's SBP equivalent use (bcast, reduce;
    allreduce; allgather, reduce-scatter) within and between the nodes, from `sbatch slurm/sweep.sh`."""
    out = cluster.work / "cai"
    env = {"COMMCAL_PRESET": "quick", "COMMCAL_LINKS": "intra,inter", "COMMCAL_OPS": "bcast,reduce,allreduce,"
           "allgather,reduce_scatter,gemm", "COMMCAL_SIZES": "4K,32K,256K,1M,2M", "COMMCAL_OUT_DIR": str(out),
           "COMMCAL_RUN_NAME": "run", "COMMCAL_REPORT": "0", "COMMCAL_AFTER_GEMM": "0"}
    job = cluster.sbatch("-o", "cai-sweep-%j.out", str(SWEEP), env=env)
    ok, text = cluster.wait(job, 420)
    assert ok, f"{text}\n{(cluster.work / f'cai-sweep-{job}.out').read_text()}\n{cluster.logs()}"
    return next(out.glob("localcluster-*.json"))


def test_sbatch_validate_sh_runs_colossal_2d_across_the_nodes_with_priced_bytes(cluster, cai_calibration):
    """Colossal-AI's 2D SUMMA (cai-2d) and its SBP equivalent (m.n/ws between the same placements) on a 2x2 mesh of
    2 nodes x 2 ranks, by slurm/validate.sh with --strategies cai-2d,cai-sbp. Both run with correct numerics on
    both nodes; every rank hands collectives exactly the bytes priced (for SUMMA the hand count: 3 products x q
    steps x an X block and a W block); the W broadcasts and dW reductions run on mesh axis 0, across the nodes,
    and each takes at least its bytes' time at the injected link rate (less the bucket's burst)."""
    m, k, n = CAI_LAYER
    vout = cluster.work / "cai" / "validate-2d"
    env = {"COMMCAL_CALIBRATION": str(cai_calibration), "COMMCAL_VALIDATE_OUT": str(vout), "COMMCAL_PRESET": "full",
           "COMMCAL_VALIDATE_ARGS": f"--mesh 2x2 --layer linear:m={m},k={k},n={n} --strategies cai-2d,cai-sbp "
                                    "--budget 0.5 --rounds 2 --refine-rounds 0"}
    t0 = time.monotonic()
    job = cluster.sbatch("-o", "cai-validate-%j.out", str(REPO / "slurm" / "validate.sh"), env=env)
    ok, text = cluster.wait(job, 420)
    log = (cluster.work / f"cai-validate-{job}.out").read_text()
    assert ok and "numerics ok" in log, f"{text}\n{log}\n{cluster.logs()}"
    print(f"colossal 2D validate: {time.monotonic() - t0:.0f} s")
    run = json.loads((vout / "run.json").read_text())
    assert sorted(set(run["hosts"])) == list(NODES)
    frame = pd.read_csv(vout / "strategies.csv").set_index("strategy")
    print(frame[["predicted_s", "measured_s", "predicted_comm_s", "measured_comm_s", "comm_bytes", "sent_bytes"]])
    assert set(frame.index) == {"cai-2d", "m.n/ws@cai-2d"}
    assert (frame["sent_bytes"] == frame["comm_bytes"]).all()
    assert frame.loc["cai-2d", "comm_bytes"] == 4 * 3 * 2 * (m * k + k * n) // 4
    steps = pd.read_csv(vout / "steps.csv")
    rooted = steps[(steps["strategy"] == "cai-2d") & steps["op"].isin(["bcast", "reduce"])]
    assert len(rooted) == 12 and set(rooted.loc[rooted["axis"] == 0, "link"]) == {"inter"}
    assert set(rooted.loc[rooted["axis"] == 1, "link"]) == {"intra"}
    inter = rooted[rooted["link"] == "inter"]
    assert (inter["measured_s"] >= (inter["size_bytes"] - BURST) / EXPECTED_BPS).all(), inter


def test_mpirun_runs_colossal_2p5d_on_two_nodes_of_four_ranks(cluster, cai_calibration):
    """Colossal-AI's 2.5D (cai-2.5d) on a 2x2x2 mesh of 2 nodes x 4 ranks (plain mpirun: the Slurm nodes have 2
    CPUs): depth (axis 0) crosses the nodes, the SUMMA layers stay on them. Numerics hold, the bytes handed to
    collectives are those priced, and the dW allreduce over depth, whose four groups per node share the node's
    one link, takes at least four buffers' time at the injected rate; the price counts that sharing."""
    m, k, n = CAI_LAYER
    vout = cluster.work / "cai" / "validate-2p5d"
    commcal = str(VENV_BIN / "commcal")
    t0 = time.monotonic()
    proc = cluster.run("mpirun", "-n", "8", "--host", "node1:4,node2:4", commcal, "validate", str(cai_calibration),
                       "--mesh", "2x2x2", "--layer", f"linear:m={m},k={k},n={n}", "--strategies", "cai-2.5d",
                       "--budget", "0.5", "--rounds", "2", "--refine-rounds", "0", "--out", str(vout), timeout=600,
                       check=False)
    assert proc.returncode == 0 and "numerics ok" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(f"colossal 2.5D validate: {time.monotonic() - t0:.0f} s")
    assert sorted(set(json.loads((vout / "run.json").read_text())["hosts"])) == list(NODES)
    frame = pd.read_csv(vout / "strategies.csv")
    assert list(frame["strategy"]) == ["cai-2.5d"] and (frame["sent_bytes"] == frame["comm_bytes"]).all()
    steps = pd.read_csv(vout / "steps.csv")
    depth = steps[steps["op"] == "allreduce"]
    print(depth[["what", "size_bytes", "predicted_s", "measured_s"]])
    assert len(depth) == 1 and depth["axis"].tolist() == [0] and depth["link"].tolist() == ["inter"]
    assert (depth["priced_bytes"] == 4 * depth["size_bytes"]).all(), depth     # read at the shared link's size
    assert (depth["measured_s"] >= (4 * depth["size_bytes"] - BURST) / EXPECTED_BPS).all(), depth
    assert (depth["predicted_s"] >= (4 * depth["size_bytes"] - BURST) / EXPECTED_BPS / 2).all(), depth
    assert set(steps.loc[steps["op"].isin(["bcast", "reduce"]), "link"]) == {"intra"}


def test_down_stops_everything_and_is_safe_twice(cluster):
    anchors = [int((cluster.state / "pids" / f"anchor-{n}.pid").read_text()) for n in ("ctl", *NODES)]
    cluster.run("down", timeout=120)
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "commcal-" not in netns, netns
    for pid in anchors:
        assert not Path(f"/proc/{pid}").exists(), f"pid {pid} survived"
    assert "unreachable" not in subprocess.run(["ip", "route", "show", "10.77.0.0/24"], capture_output=True,
                                               text=True).stdout
    assert not cluster.state.exists()
    again = cluster.run("down", timeout=60)
    assert "nothing to do" in again.stderr


def test_a_cluster_a_killed_test_run_left_up_is_brought_down_and_one_in_use_is_not(tmp_path_factory):
    """brought_up: a cluster whose test run is gone (its pytest.pid names no live process) is brought down before the
    next comes up; one whose run is alive (this one) is left alone, and the next test fails saying so."""
    gone = subprocess.Popen(["true"])
    gone.wait()                                             # a pid no process holds any more
    with brought_up(tmp_path_factory, "left", "--nodes", "1", "--no-slurm") as left:
        (left.state.parent / HOLDER).write_text(str(gone.pid))   # as if the run that brought it up was killed
        with brought_up(tmp_path_factory, "next", "--nodes", "1", "--no-slurm") as c:
            assert Path(OWNER.read_text().strip()) == c.state
            assert c.run("exec", "node1", "hostname").stdout.strip() == "node1"
    with brought_up(tmp_path_factory, "used", "--nodes", "1", "--no-slurm") as used:
        with pytest.raises(pytest.fail.Exception, match="already up"):
            with brought_up(tmp_path_factory, "second", "--nodes", "1", "--no-slurm"):
                pass
        assert Path(OWNER.read_text().strip()) == used.state, "the cluster in use is untouched"
