"""`commcal validate` on real mpirun jobs: every strategy of matmul (linear), MLP and embedding runs with
correct numerics at 2 and 4 ranks (meshes 2, 2x2, 4), the directory is what reports/validation_view.py
reads, a link class the calibration lacks is one warning and a summary record (--strict: bad input), bad input is
one line with exit 2, and benchmarks.validate runs its control mesh."""

import json
import os
from pathlib import Path
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from calib.synthetic import synthetic_calibration
from conftest import REPO, mpi_env, mpiexec_argv, run_main, run_mpi
from repeats import ACCURACY_MARGIN, RANK_MARGIN, Validates
from analysis import attribution, ranking
from analysis.harness import TOLERANCE
from analysis.mesh import parse_mesh
from analysis.models import parse_model
from reports.validation_view import load_validation
from test_gpu import GPU_REASON

pytestmark = pytest.mark.mpi
OPS = ("allreduce", "allgather", "reduce_scatter", "alltoall")
LAYERS = ["--layer", "linear:m=8,k=8,n=16", "--layer", "mlp:batch=8,d_in=8,d_hidden=16",
          "--layer", "embedding:vocab=16,dim=8,tokens=16,density=0.25"]
FAST = ["--budget", "0.005", "--min-samples", "2", "--target-ci", "0.5", "--bootstrap", "50",
        "--max-strategies", "1000"]


def calibration(path, links=("intra",), after_compute: bool = False, pages: str | None = None,
                speeds: bool = False, alpha_beta: tuple[float, float] = (5e-6, 1e-9)):
    """A synthetic calibration, every collective priced by `alpha_beta`; after_compute adds models 1 ms slower per
    call for collectives after compute; pages: the huge-page advice its (one, made-up) sweep recorded; speeds: every
    model says some of its points were priced at the fast one of several speeds (version 16 and later)."""
    models = {(op, link): alpha_beta for op in OPS for link in links}
    after = {k: (1e-3, 1e-9) for k in models} if after_compute else None
    data = synthetic_calibration(models, links={l: [2, 4] for l in links}, gemm={"float32": 1e10, "float64": 5e9},
                                 after_compute=after)
    if speeds:
        for by_link in data["models"].values():
            for m in by_link.values():
                m["speeds"] = {"n_points": 1, "of_points": 9, "max_ratio": 1.9, "max_at_bytes": 4194304.0,
                               "max_at_procs": 2}
    if pages:
        data["provenance"]["runs"].append({"run_id": "r", "dir": "r", "date": "d", "machine": "m", "hosts": ["m"],
                                           "mpi_library": "x", "versions": {}, "page_policy": pages})
    path.write_text(json.dumps(data))
    return str(path)


def test_a_launch_slower_than_every_price_and_recorded_speed_is_named(tmp_path):
    """A calibration pricing every collective a thousand times too fast (1 ns a call) with a slow speed recorded at
    1.9x: every collective's verdict is slower, summary.json says slow_launch and validate warns, naming both causes."""
    cal = calibration(tmp_path / "cal.json", speeds=True, alpha_beta=(1e-9, 1e-15))
    out = tmp_path / "val"
    proc = run_mpi(2, ["validate", cal, "--mesh", "2", "--out", str(out), "--layer", "linear:m=8,k=8,n=8", *FAST],
                   check=True)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step_ratios"] and {r["verdict"] for r in summary["step_ratios"]} == {"slower"}
    assert summary["slow_launch"] is True
    assert "warning: every collective ran more than 5% slower than its price: this launch ran slow" in proc.stdout
    assert "or the calibration prices too fast" in proc.stdout


@pytest.mark.parametrize("ranks,mesh", [(2, "2"), (2, "1x2"), (4, "2x2"), (4, "4")])
def test_every_strategy_is_numerically_correct(tmp_path, ranks, mesh):
    cal, out = calibration(tmp_path / "cal.json"), tmp_path / "val"
    proc = run_mpi(ranks, ["validate", cal, "--mesh", mesh, "--out", str(out), *LAYERS, *FAST], check=True)
    frame = pd.read_parquet(out / "strategies.parquet")
    m = parse_mesh(mesh, ranks, ranks)
    want = sum(len(l.strategies(m)) for spec in LAYERS[1::2] for l in parse_model(spec).layers)
    assert len(frame) == want and set(frame["selected"]) == {"all"}
    assert set(frame["layer"]) == {"linear.linear", "mlp.fc1", "mlp.act1", "mlp.fc2", "embedding.embed"}
    assert (frame["max_rel_err"] <= TOLERANCE["float32"]).all()
    assert (frame["measured_s"] > 0).all() and (frame["samples"] >= 2 * 3).all()
    assert (frame["rounds"] == 3 + 6 * frame["refined"]).all() and (frame["round_spread"] >= 0).all()  # pooled
    assert frame.groupby("layer")["refined"].any().all()       # each layer's contenders: 6 more passes
    steal = frame["cpu_steal"].dropna()          # unknown only where a strategy's visits spanned no clock tick
    assert len(steal) and steal.between(0, 1).all()
    comm = frame[frame["comm_steps"] > 0]
    assert len(comm) and (comm["measured_comm_s"] > 0).all() and (comm["predicted_comm_s"] > 0).all()
    assert (frame.loc[frame["comm_steps"] == 0, "measured_comm_s"] == 0).all()
    assert "numerics ok" in proc.stdout and "the calibration does not say" in proc.stdout
    sharing, cpus = json.loads((out / "summary.json").read_text())["cpu_sharing"], len(os.sched_getaffinity(0))
    if ranks > cpus:                            # ranks time-share the cores: recorded, and said
        assert sharing == {"ranks": ranks, "cpus": cpus} and f"{ranks} ranks share {cpus} CPU(s)" in proc.stdout
    elif not os.environ.get("MPIEXEC"):         # a launcher of the user's may bind ranks to fewer cores
        assert sharing is None and "ranks share" not in proc.stdout, proc.stdout
    steps = pd.read_parquet(out / "steps.parquet")
    per = steps.groupby(["layer", "strategy"]).apply(lambda g: (g["op"] != "compute").sum() - (g["op"].isin(
        ["slice", "partial", "relabel"])).sum(), include_groups=False)
    assert (per.reindex(pd.MultiIndex.from_frame(frame[["layer", "strategy"]])).to_numpy()
            == frame["comm_steps"].to_numpy()).all()


def test_directory_is_what_the_report_reads(tmp_path):
    cal, out = calibration(tmp_path / "cal.json", after_compute=True, pages="hugepage", speeds=True), tmp_path / "val"
    proc = run_mpi(2, ["validate", cal, "--mesh", "2", "--out", str(out), "--layer", "linear:m=8,k=8,n=8", *FAST],
                   check=True)
    assert "pages hugepage" in proc.stdout          # the calibration's sweep advice, not numpy's default
    val = load_validation(out)
    names = {m.name for m in val.metrics}
    assert {"kendall_tau", "top1", "regret", "mean_accuracy", "pairwise_accuracy", "comm_kendall_tau"} <= names
    for m in val.metrics:
        assert m.low is None or m.low <= m.value <= m.high
    assert len(val.strategies) == 8 and {"predicted_comm_s", "measured_comm_s"} <= set(val.strategies.columns)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mesh"].startswith("2 ") and "linear.linear" in summary["layers"]
    want = ranking.flat(ranking.frame_scores(pd.read_parquet(out / "strategies.parquet"), 3, 0, 0))
    assert "resolved_tau" in want          # 8 strategies, communicating or not: some pair lies RESOLUTION apart
    for name in ("resolved_tau", "comm_resolved_tau"):
        assert (name in summary["metrics"]) == (name in want), name
        if name in want:
            assert summary["metrics"][name]["value"] == pytest.approx(want[name]["value"]), name
    assert summary["allocator"] == "cache" and summary["memcpy_alias_slowdown"] > 0
    assert summary["page_policy"] == "hugepage"
    assert summary["fallbacks"] == [] and "commcal: warning" not in proc.stderr     # the calibration has intra
    s = val.strategies
    near = (s["predicted_s"] <= s["predicted_s"].min() * 1.1) | ((s["comm_steps"] > 0) & (
        s["predicted_comm_s"] <= s.loc[s["comm_steps"] > 0, "predicted_comm_s"].min() * 1.1))
    assert near.any() and s.loc[near, "refined"].all() and (s["rounds"] == 3 + 6 * s["refined"]).all()
    assert summary["refine"] == {"rounds": 6, "margin": 0.1, "strategies": int(s["refined"].sum())}
    comm = val.strategies[val.strategies["comm_steps"] > 0]        # one node: all of it intra-node
    assert list(summary["by_link"]) == ["intra"] and summary["by_link"]["intra"]["strategies"] == len(comm)
    acc = summary["by_link"]["intra"]["comm_mean_accuracy"]["value"]
    assert acc == pytest.approx(summary["metrics"]["comm_mean_accuracy"]["value"])
    steps = pd.read_parquet(out / "steps.parquet")
    ratios = {(r["op"], r["link"]): r for r in summary["step_ratios"]}
    assert set(ratios) == {(op, "intra") for op in steps["op"] if op in OPS}
    assert sum(r["steps"] for r in ratios.values()) == steps["op"].isin(OPS).sum()
    # every model was priced at the fast one of several speeds: each collective counts its steps over 1.15x
    ratio = steps["measured_s"] / steps["predicted_s"]
    for (op, _), r in ratios.items():
        assert r["sweep_slow_ratio"] == 1.9 and r["slow_steps"] == int((ratio[steps["op"] == op] > 1.15).sum())
        assert r["verdict"] == attribution.verdict(r["median"], 1.9)
    assert summary["slow_launch"] == attribution.slow_launch(summary["step_ratios"])
    assert ("warning: every collective ran" in proc.stdout) == summary["slow_launch"]
    assert "priced some points at the fast one of several speeds" in proc.stdout
    steps = steps.sort_values(["layer", "strategy", "index"])
    prev = steps.groupby(["layer", "strategy"])["op"].shift()
    right_after = steps["op"].isin(OPS) & prev.isin([*OPS, "compute"])    # a collective right after one of those
    assert (steps.loc[right_after, "after_compute"] == (prev[right_after] == "compute")).all()
    calls = steps[steps["op"].isin(OPS)]          # the after-compute models price exactly those after compute
    assert calls["after_compute"].any() and (~calls["after_compute"]).any()
    assert ((calls["predicted_s"] > 1e-3) == calls["after_compute"]).all()
    per = calls.groupby(["layer", "strategy"])["predicted_s"].sum()
    np.testing.assert_allclose(per.reindex(pd.MultiIndex.from_frame(comm[["layer", "strategy"]])),
                               comm["predicted_comm_s"], rtol=1e-9)
    run = json.loads((out / "run.json").read_text())
    assert run["mpi_library_version"] and run["cpu_steal"] == summary["cpu_steal"]
    assert set(summary["cpu_steal"]) == set(run["hosts"]) and 0 <= summary["cpu_steal"][run["hosts"][0]] <= 1


@pytest.mark.parametrize("ranks,args,says", [
    (2, ["--mesh", "2x2", "--layer", "linear:m=8,k=8,n=8"], "has 4 devices"),
    (2, ["--mesh", "2", "--layer", "linear:m=3,k=8,n=8"], "not divisible by 2"),
    (2, ["--mesh", "2", "--layer", "linear:m=8,k=8,n=8", "--inter-only", "--strict"], "no 'intra' model for"),
    (2, ["--mesh", "2", "--layer", "bogus"], "unknown model or layer"),
    (2, ["--mesh", "2", "--layer", "linear:m=8,k=8,n=8", "--refine-rounds", "-1"], "--refine-rounds >= 0"),
    (2, ["--mesh", "2", "--layer", "linear:m=8,k=8,n=8", "--backend", "nccl"], "needs a calibration of the same backend"),
    (2, ["--mesh", "2", "--layer", "linear:m=8,k=8,n=8", "--allocator", "pool"], "--allocator: invalid choice"),
    (2, ["--mesh", "2", "--layer", "linear:m=8,k=8,n=8", "--seed", "-1"], "0 <= --seed < 2^63"),
    (2, ["--mesh", "2", "--layer", "linear:m=8,k=8,n=8", "--top-k", "0"], "validate needs --top-k >= 1"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, ranks, args, says):
    inter = "--inter-only" in args
    cal = calibration(tmp_path / "cal.json", ("inter",) if inter else ("intra",))
    args = [a for a in args if a != "--inter-only"]
    proc = run_mpi(ranks, ["validate", cal, "--out", str(tmp_path / "v"), *args, *FAST])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.startswith("commcal: error")]
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "v").exists()


def _check_out_often(out: str, times: int) -> str:
    """check_out(out) `times` times in this process; the first error's text, or ''."""
    from analysis.validate_cmd import check_out
    from microbench.errors import UsageError
    try:
        for _ in range(times):
            check_out(out)
    except UsageError as exc:
        return str(exc)
    return ""


def test_every_rank_checking_a_new_out_at_once_passes(tmp_path):
    """Every rank of a job checks --out before MPI starts, at the same moment: a probe of one rank never makes
    another's fail (a probe that made and removed the --out path itself did, now and then: 'cannot write (File
    exists)'), and none leaves anything behind."""
    import multiprocessing
    out = str(tmp_path / "new" / "v")
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        errors = pool.starmap(_check_out_often, [(out, 300)] * 4)
    assert errors == [""] * 4 and list(tmp_path.iterdir()) == [], errors


@pytest.mark.parametrize("where,says", [("run", "a sweep run directory, which validate's files would replace"),
                                        ("file", "exists and is not a directory"),
                                        ("/proc/commcal-x", "cannot write")])
def test_an_out_validate_cannot_use_is_refused_before_anything_runs(tmp_path, capsys, where, says):
    """--out naming a sweep run (whose run.json validate's would replace), a file, or a place nothing can be written:
    one line and exit 2 before MPI starts, the run untouched."""
    run = tmp_path / "run"
    shutil.copytree(REPO / "tests" / "data" / "runs" / "racks-pingpong-tbf", run)
    (tmp_path / "file").write_text("x")
    before = (run / "run.json").read_text()
    out = where if where.startswith("/") else str(tmp_path / where)
    code, _, err = run_main(capsys, ["validate", calibration(tmp_path / "cal.json"), "--mesh", "2", "--layer",
                                     "linear:m=8,k=8,n=8", "--out", out, *FAST])
    assert code == 2 and err.count("\n") == 1 and says in err, err
    assert (run / "run.json").read_text() == before and not Path("/proc/commcal-x").exists()


def test_a_missing_link_class_is_one_warning_and_recorded_in_the_summary(tmp_path):
    """One node (mesh axis 0 wants intra) and a calibration of inter only: inter prices it, stderr says so once,
    summary.json records each collective; the --strict refusal is in test_bad_input_is_one_line_and_exit_2."""
    cal, out = calibration(tmp_path / "cal.json", ("inter",)), tmp_path / "val"
    data = json.loads(Path(cal).read_text())   # and its sweep took the quick path, in one launch, 4 ranks on 2 CPUs
    data["provenance"]["runs"] = [{"run_id": "r", "dir": "r", "date": "d", "machine": "m", "hosts": ["m"],
                                   "mpi_library": "x", "versions": {}, "preset": "quick", "launches": 1,
                                   "cpu_sharing": {"ranks": 4, "cpus": 2}}]
    Path(cal).write_text(json.dumps(data))
    proc = run_mpi(2, ["validate", cal, "--mesh", "2", "--out", str(out), "--layer", "linear:m=8,k=8,n=8", *FAST],
                   check=True)
    summary = json.loads((out / "summary.json").read_text())
    assert [l.split(" ")[3] for l in summary["calibration_advice"]] == ["quick", "measured", "ranks"]
    assert all(f"warning: {line}" in proc.stdout.splitlines() for line in summary["calibration_advice"])
    fallbacks = summary["fallbacks"]
    ops = sorted({f["op"] for f in fallbacks})
    assert "allreduce" in ops and len(ops) == len(fallbacks)
    assert all(f == {"op": f["op"], "axis": 0, "wanted": "intra", "used": "inter"} for f in fallbacks)
    assert [l for l in proc.stderr.splitlines() if l.startswith("commcal:")] == [
        f"commcal: warning: calibration {cal} has no 'intra' model for {', '.join(ops)} (mesh axis 0); priced by "
        "its 'inter' models"]


def test_bench_validate_scores_repeats_on_a_control_mesh_and_names_a_failed_step(tmp_path):
    """bench_validate with a calibration, --mesh 2, --repeat 2 and a layer of the user's (--layer) on 2 ranks prints
    each run's metrics and each run scored as the other's prediction, validating that layer alone; a validate that
    refuses its input (mesh 3 on 2 ranks) ends it with exit 2 and one line naming that command, no traceback."""
    cal = calibration(tmp_path / "cal.json")
    bench = lambda mesh, out: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "benchmarks.validate", "--launch", shlex.join(mpiexec_argv(2)), "--calibration", cal,
         "--mesh", mesh, "--out", str(out), "--repeat", "2", "--layer", "linear:m=8,k=8,n=16",
         "--validate-args", shlex.join(FAST)],
        env=mpi_env(), cwd=REPO, capture_output=True, text=True, timeout=300)
    proc = bench("2", tmp_path / "ok")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    header = next(l for l in proc.stdout.splitlines() if l.startswith("metric"))
    assert header.split()[1:] == ["run", "1", "run", "2", "1", "as", "2", "2", "as", "1", "target"]
    tau = next(l for l in proc.stdout.splitlines() if l.startswith("comm_kendall_tau")).split()
    assert all(-1 <= float(v) <= 1 for v in tau[1:5]) and tau[5:7] == [">=", "0.9"]
    for run in ("validate", "validate-2"):
        assert json.loads((tmp_path / "ok" / run / "summary.json").read_text())["mesh"].startswith("2 (1 nodes x 2")
        assert set(pd.read_csv(tmp_path / "ok" / run / "strategies.csv").layer) == {"linear.linear"}
    proc = bench("3", tmp_path / "bad")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("bench_validate: ") and " validate " in last and "--mesh 3" in last
    assert last.endswith("exited 2")


CPUS = len(os.sched_getaffinity(0))


@pytest.mark.skipif(CPUS < 4, reason=f"{CPUS} CPUs here: 4 ranks would share them (cpu_sharing), and the claim is "
                                     "for a core per rank (.ci/cores-node runs it on a machine that has one)")
def test_with_a_core_per_rank_the_calibration_ranks_2x2_strategies_as_well_as_a_second_validate(tmp_path):
    """The headline claim where ranks do not time-share cores: bench_validate on one host, 4 ranks each bound to a
    core, its own sweeps and fit, two quick validates on mesh 2x2; on each validate the calibration ranks the
    strategies by communication nearly as well as the other validate does (RANK_MARGIN in comm Kendall tau) and
    prices them nearly as well (ACCURACY_MARGIN in comm mean accuracy)."""
    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.validate", "--launch", shlex.join(mpiexec_argv(4, "core")),
                           "--links", "intra", "--mesh", "2x2", "--repeat", "2", "--validate-args=--quick",
                           "--out", str(out)], env=mpi_env(), cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    print(proc.stdout[proc.stdout.find("metric "):])
    runs = [out / "validate", out / "validate-2"]
    summaries = [json.loads((run / "summary.json").read_text()) for run in runs]
    assert [s["cpu_sharing"] for s in summaries] == [None, None], "the premise: a core per rank"
    validates = Validates([s["metrics"] for s in summaries], [pd.read_parquet(r / "strategies.parquet") for r in runs])
    lines = (validates.against_repeat("comm_kendall_tau", RANK_MARGIN)
             + validates.against_repeat("comm_mean_accuracy", ACCURACY_MARGIN))
    assert not any(line.endswith("MISSED") for line in lines), "\n".join(lines)


def test_bench_default_path_refuses_fewer_than_two_validates_in_one_line(tmp_path):
    """The default-path benchmark needs a repeat to score against: --repeat 1 is one usage line, exit 2, before any
    cluster is brought up."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.default_path", "--out", str(tmp_path / "dp"),
                           "--repeat", "1"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--repeat must be at least 2" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "dp").exists()


def test_bench_default_path_meets_a_gap_only_where_the_calibration_is_that_close_to_the_repeat():
    """The verdict compares the calibration's mean with the repeat's: short by more than the gap is missed, short by
    less or better than the repeat is met (a tau of 0.5 against a repeat of 1.0 misses; accuracy 0.9102 against
    0.9519 misses 0.03; 0.9453 against 0.9116 meets)."""
    from benchmarks.default_path import verdicts
    lines = verdicts({"800mbit": {"comm_mean_accuracy": (0.9102, 0.9519), "comm_kendall_tau": (0.5, 1.0)},
                      "400mbit": {"comm_mean_accuracy": (0.9453, 0.9116), "comm_kendall_tau": (0.96, 1.0)}})
    ends = [line.split()[-1] for line in lines[1:]]
    assert ends == ["missed", "missed", "MET", "MET"], lines
    assert " 0.0417 " in lines[1] and " -0.0337 " in lines[3], lines


@pytest.mark.gpu
@pytest.mark.skipif(GPU_REASON is not None, reason=GPU_REASON or "")
@pytest.mark.parametrize("backend", ["nccl", "mpi-cuda"])
def test_gpu_backends_run_every_strategy_with_cupy_arrays(tmp_path, backend):
    """One rank per GPU (NCCL allows no more on a one-GPU machine): mesh 1, every strategy, numerics checked."""
    models = {(op, "intra"): (5e-6, 1e-9) for op in OPS}
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(synthetic_calibration(models, links={"intra": [1, 2]}, gemm={"float32": 1e13},
                                                    backend=backend)))
    proc = run_mpi(1, ["validate", str(cal), "--mesh", "1", "--backend", backend, "--out", str(tmp_path / "v"),
                       *LAYERS, *FAST])
    if backend == "mpi-cuda" and proc.returncode == 2 and "CUDA support" in proc.stderr:
        pytest.skip("this MPI is not CUDA-aware: " + proc.stderr.strip().splitlines()[0])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (pd.read_csv(tmp_path / "v" / "strategies.csv").max_rel_err <= TOLERANCE["float32"]).all()


def test_validate_sh_passes_its_backend_knob_and_refuses_a_bad_one(tmp_path):
    """slurm/validate.sh in a job's environment (Slurm's variables set, mpirun as launcher): COMMCAL_BACKEND goes to
    validate as --backend; a backend that is none of commcal's fails the job in one line, exit 2, before launching."""
    import os
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))     # commcal is not installed
    env = mpi_env() | {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "2", "COMMCAL_LAUNCHER": "mpirun", "PYTHONPATH": path,
                       "COMMCAL": shlex.join([sys.executable, "-m", "reports.cli"]), "COMMCAL_PRESET": "full",
                       "COMMCAL_CALIBRATION": calibration(tmp_path / "cal.json"),
                       "COMMCAL_VALIDATE_ARGS": shlex.join(["--mesh", "2", "--layer", "linear:m=8,k=8,n=8", *FAST])}

    def job(backend: str, out: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(REPO / "slurm" / "validate.sh")], cwd=tmp_path, capture_output=True,
                              text=True, timeout=300,
                              env=env | {"COMMCAL_BACKEND": backend, "COMMCAL_VALIDATE_OUT": str(tmp_path / out)})
    bad = job("cuda", "b")
    assert bad.returncode == 2 and bad.stderr.count("FAILED") == 1 and "COMMCAL_BACKEND" in bad.stderr, bad.stderr
    assert not (tmp_path / "b").exists()
    good = job("mpi", "g")
    assert good.returncode == 0, good.stdout + good.stderr
    argv = json.loads((tmp_path / "g" / "run.json").read_text())["argv"]
    assert argv[argv.index("--backend") + 1] == "mpi", argv


def test_validate_sh_run_twice_keeps_the_first_validation(tmp_path):
    """slurm/validate.sh twice with its default output: the second job writes the day's -2 directory beside the
    first, whose measurements it leaves as they were (validate would replace an earlier validation's files)."""
    import os
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))     # commcal is not installed
    env = mpi_env() | {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "2", "COMMCAL_LAUNCHER": "mpirun", "PYTHONPATH": path,
                       "COMMCAL": shlex.join([sys.executable, "-m", "reports.cli"]), "COMMCAL_PRESET": "full",
                       "COMMCAL_CALIBRATION": calibration(tmp_path / "cal.json"), "COMMCAL_OUT_DIR": str(tmp_path),
                       "COMMCAL_VALIDATE_ARGS": shlex.join(["--mesh", "2", "--layer", "linear:m=8,k=8,n=8", *FAST])}
    env.pop("COMMCAL_VALIDATE_OUT", None)
    kept = None
    for k in (1, 2):
        proc = subprocess.run(["bash", str(REPO / "slurm" / "validate.sh")], cwd=tmp_path, capture_output=True,
                              text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        outs = sorted(tmp_path.glob("validate-*"), key=lambda p: len(p.name))
        assert len(outs) == k and all((p / "summary.json").is_file() for p in outs), outs
        assert kept is None or (outs[0] / "run.json").read_bytes() == kept
        kept = (outs[0] / "run.json").read_bytes()
    assert outs[1].name == f"{outs[0].name}-2" and f"done: {outs[1]}" in proc.stdout, proc.stdout


def test_bench_rescore_reprices_a_stored_validate_as_validate_priced_it(tmp_path):
    """benchmarks.rescore re-prices a validate's collective steps without MPI, layout copies included (the
    embedding's sparse all-gather packs and unpacks its rows): with the calibration the validate used, every metric
    comes back unchanged; with one whose every alpha and beta is three times as large, the metrics are those of the
    stored table with its collectives' predictions tripled and their copies as they were; a directory that is no
    validate's output, or a calibration it cannot read, is one line and exit 2."""
    from analysis import ranking
    from analysis.pricing import Pricer
    from benchmarks import rescore
    from calib.calibration import load_calibration
    from microbench.ops import OPS
    cal = calibration(tmp_path / "cal.json")
    data = json.loads(Path(cal).read_text())
    data["compute"]["copy"] = {"bytes_per_s": 1e9, "latency_s": 1e-6, "n_points": 2, "groups_per_node": 1}
    Path(cal).write_text(json.dumps(data))
    out = tmp_path / "v"
    proc = run_mpi(2, ["validate", cal, "--mesh", "2", "--out", str(out), *LAYERS, *FAST], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    steps = pd.read_csv(out / "steps.csv")
    assert (steps["copy_calls"] > 0).any(), "no step with layout copies: the copies go unchecked"
    mesh = rescore._mesh(summary)
    same = rescore.rescore(out, Pricer(load_calibration(cal), mesh), None)
    for name in rescore.METRICS:
        assert same[name]["value"] == pytest.approx(summary["metrics"][name]["value"], abs=1e-12), name
    data = json.loads(Path(cal).read_text())
    for by_link in data["models"].values():
        for m in by_link.values():
            for seg in m["segments"]:
                seg["alpha_s"] *= 3
                seg["beta_s_per_byte"] *= 3
    triple = tmp_path / "triple.json"
    triple.write_text(json.dumps(data))
    got = rescore.rescore(out, Pricer(load_calibration(str(triple)), mesh), None)
    frame = pd.read_parquet(out / "strategies.parquet")
    pricer = Pricer(load_calibration(cal), mesh)
    coll = steps[steps["op"].isin(list(OPS)) & (steps["size_bytes"] > 0)]
    copies = [pricer.copy_calls_seconds(c, e) for c, e in zip(coll["copy_calls"], coll["copy_elements"])]
    comm = (coll["predicted_s"] - copies).groupby([coll["layer"], coll["strategy"]]).sum()
    frame["predicted_comm_s"] += [2 * comm.get(k, 0.0) for k in zip(frame["layer"], frame["strategy"])]
    want = ranking.flat(ranking.frame_scores(frame, 3, 0, 0))
    assert got["comm_mean_accuracy"]["value"] != pytest.approx(same["comm_mean_accuracy"]["value"])
    for name in rescore.METRICS:
        assert got[name]["value"] == pytest.approx(want[name]["value"], rel=1e-9), name
    bad = subprocess.run([sys.executable, "-m", "benchmarks.rescore", cal, str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "not a validate directory" in bad.stderr
    (tmp_path / "broken.json").write_text("{")
    bad = subprocess.run([sys.executable, "-m", "benchmarks.rescore", str(tmp_path / "broken.json"), str(out)],
                         cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "broken.json" in bad.stderr, bad.stderr
