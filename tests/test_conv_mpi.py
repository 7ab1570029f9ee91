"""CNNs on real mpirun jobs: every strategy of every conv layer kind (batch norm included), and a whole network under
each of ParaDL's strategies (the pipeline on the pipeline executor), match a single process forward and backward
at 2 and 4 ranks; the bytes the harness
hands MPI for halo exchanges and gradient allreduces are ParaDL's volumes (from the layer shapes) and the priced
ones; benchmarks.paradl prints its table from a given calibration, compute from the profile it makes; bad network input is one line and exit 2."""

import json
import shlex
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

from analysis.harness import TOLERANCE
from analysis.kernel_profile import load_profile
from analysis.mesh import parse_mesh
from analysis.models import parse_model
from analysis.paradl import PIPELINE_MICRO_BATCHES, PIPELINE_SCHEDULE, pipeline
from calib.calibration import load_calibration
from calib.synthetic import synthetic_calibration
from conftest import REPO, mpi_env, mpiexec_argv, run_mpi

pytestmark = pytest.mark.mpi
OPS = ("allreduce", "allgather", "reduce_scatter", "alltoall", "sendrecv", "pingpong")
CNN = "cnn:batch=4,image=8,channels=4,convs=8-p-8,dense=8,bn=1"
FAST = ["--budget", "0.005", "--min-samples", "2", "--target-ci", "0.5", "--bootstrap", "20", "--rounds", "1",
        "--refine-rounds", "0", "--max-strategies", "1000"]


def calibration(path) -> str:
    models = {(op, "intra"): (5e-6, 1e-9) for op in OPS}
    path.write_text(json.dumps(synthetic_calibration(models, links={"intra": [2, 4]},
                                                     gemm={"float32": 1e10, "float64": 5e9})))
    return str(path)


@pytest.mark.parametrize("ranks,mesh", [(2, "2"), (4, "4")])      # 2x2: the whole networks below
def test_every_conv_layer_strategy_matches_one_process(tmp_path, ranks, mesh):
    cal, out = calibration(tmp_path / "cal.json"), tmp_path / "v"
    proc = run_mpi(ranks, ["validate", cal, "--mesh", mesh, "--out", str(out), "--layer", CNN, *FAST], check=True)
    frame = pd.read_parquet(out / "strategies.parquet")
    m = parse_mesh(mesh, ranks, ranks)
    assert len(frame) == sum(len(l.strategies(m)) for l in parse_model(CNN).layers)
    assert {"cnn.conv1", "cnn.bn1", "cnn.relu1", "cnn.pool1", "cnn.conv2", "cnn.bn2", "cnn.relu2", "cnn.flatten",
            "cnn.fc1"} == set(frame["layer"])
    assert (frame["max_rel_err"] <= TOLERANCE["float32"]).all() and (frame["measured_s"] > 0).all()
    assert proc.stdout.count("numerics ok") == 9
    steps = pd.read_parquet(out / "steps.parquet")
    halos = steps[steps["op"] == "sendrecv"]
    assert set(halos["strategy"].str.count("s")) == {1} and set(halos["layer"]) == {"cnn.conv1", "cnn.conv2"}
    bn = steps[(steps["layer"] == "cnn.bn1") & (steps["op"] != "compute")]    # batch or height split: 2 x 8 sums
    assert set(bn["op"]) == {"allreduce"} and set(bn["size_bytes"]) == {2 * 8 * 4}
    assert set(bn["strategy"]) == {s for s in frame.loc[frame["layer"] == "cnn.bn1", "strategy"] if set(s) & set("ns")}


@pytest.mark.parametrize("ranks,mesh,strategies", [
    (2, "2", ["data", "filter", "channel", "spatial"]),
    (4, "4", ["data", "filter", "channel", "spatial"]),
    (4, "2x2", ["data", "filter", "channel", "data+filter", "data+spatial"])])
def test_whole_network_strategies_match_one_process(tmp_path, ranks, mesh, strategies):
    cal, out = calibration(tmp_path / "cal.json"), tmp_path / "v"
    proc = run_mpi(ranks, ["validate", cal, "--mesh", mesh, "--out", str(out), "--model", "vgg-small", *FAST],
                   check=True)
    frame = pd.read_parquet(out / "strategies.parquet")
    assert list(frame["strategy"]) == strategies and set(frame["layer"]) == {"vgg-small"}
    assert (frame["max_rel_err"] <= TOLERANCE["float32"]).all() and "numerics ok" in proc.stdout
    assert (frame["sent_bytes"] == frame["comm_bytes"]).all() and (frame["comm_bytes"] > 0).all()  # sent as priced
    steps = pd.read_parquet(out / "steps.parquet")
    comm = steps[steps["op"].isin(OPS)]
    # every strategy's priced communication is the sum of its steps' prices, the steps the harness timed
    per = comm.groupby("strategy")["predicted_s"].sum().reindex(frame["strategy"]).to_numpy()
    assert per == pytest.approx(frame["predicted_comm_s"].to_numpy(), rel=1e-6, abs=1e-3 * per.min())
    ops = comm.groupby("strategy")["op"].agg(set)
    assert "allreduce" in ops["data"] and not {"alltoall", "sendrecv"} & ops["data"]    # gradient reductions only
    assert "allgather" in ops["filter"] and "reduce_scatter" in ops["channel"]
    assert "sendrecv" in ops.get("spatial", ops.get("data+spatial"))
    advice = json.loads((out / "summary.json").read_text())["calibration_advice"]   # compute by the rates: said
    assert any("commcal profile" in line for line in advice) and "commcal profile" in proc.stdout


PIPE = "cnn:batch=4,image=8,channels=2,convs=4-p-8,dense=8-4"


@pytest.mark.parametrize("ranks", [2, 4])
def test_pipeline_strategy_matches_one_process_on_the_priced_stages(tmp_path, ranks):
    """ParaDL's pipeline over `ranks` stages (GPipe, 4 micro-batches of 1 image, stages balanced by the
    calibration's times, so NCHW tensors cross some boundaries and flat rows others): outputs and weight gradients
    within float32's tolerance of one float64 process; the row's stages and prediction are analysis.paradl.pipeline's
    (search's), its step measured with messages and bubble as its communication."""
    cal, out = calibration(tmp_path / "cal.json"), tmp_path / "v"
    proc = run_mpi(ranks, ["validate", cal, "--mesh", str(ranks), "--out", str(out), "--model", PIPE,
                           "--strategies", "pipeline", *FAST], check=True)
    row = pd.read_parquet(out / "strategies.parquet").set_index("strategy").loc["pipeline"]
    pipe = pipeline(PIPE, load_calibration(cal), parse_mesh(str(ranks), ranks, ranks), PIPELINE_MICRO_BATCHES,
                    PIPELINE_SCHEDULE)
    assert len(pipe.stages) == ranks and row["stages"] == "-".join(map(str, pipe.stages))
    assert row["predicted_s"] == pytest.approx(pipe.total_s)
    assert row["predicted_comm_s"] == pytest.approx(pipe.bubble_s + pipe.messages_s)
    assert row["max_rel_err"] <= TOLERANCE["float32"] and "pipeline run, numerics ok" in proc.stdout
    assert 0 < row["measured_comm_s"] < row["measured_s"]


SCRIPT = textwrap.dedent("""
    import json, math, sys
    from collections import Counter
    import numpy as np
    from mpi4py import MPI
    from analysis.harness_chain import network_data, network_program
    from analysis.harness_comm import Collectives, job_mesh
    from analysis.harness_exec import Runner
    from analysis.models import parse_model
    from analysis.paradl import network_options
    from analysis.pricing import Pricer
    from analysis.search import Tabulator
    from calib.calibration import load_calibration

    class Counting(Collectives):
        '''The real Collectives, counting the bytes each call hands MPI.'''
        def __init__(self, *a):
            super().__init__(*a)
            self.by_op = Counter()
        def allreduce(self, buf, axis):
            self.by_op["allreduce"] += buf.nbytes
            return super().allreduce(buf, axis)
        def shift(self, buf, axis, direction):
            self.by_op["sendrecv"] += buf.nbytes
            return super().shift(buf, axis, direction)

    world = MPI.COMM_WORLD
    mesh, coord, _ = job_mesh(world, sys.argv[1])
    model = parse_model(sys.argv[3])
    coll = Counting(world, mesh, coord)
    runner = Runner(mesh, coord, coll)
    opts = network_options(model, sys.argv[4].split(","), Tabulator(Pricer(load_calibration(sys.argv[2]), mesh)))
    data = network_data(model, 0)
    out = {}
    for i, s in enumerate(opts.strategies):
        prog = network_program(runner, opts, i, data, "float32")
        coll.by_op.clear()
        env = dict(prog.inputs)
        for it in prog.items:
            it.run(env)
        priced = Counter()
        for st in opts.steps(i):
            if not hasattr(st, "flops") and st.is_comm:
                priced[st.op] += st.bytes_per_rank
        out[s.id] = {"sent": dict(coll.by_op), "priced": {k: priced[k] for k in ("allreduce", "sendrecv")}}
    if world.rank == 0:
        print(json.dumps(out))
""")


@pytest.mark.parametrize("ranks,mesh,strategies", [(4, "4", "data,spatial"), (4, "2x2", "data+spatial"),
                                                   (2, "2", "spatial")])
def test_halo_and_gradient_bytes_are_paradls_volumes(tmp_path, ranks, mesh, strategies):
    """Data parallelism allreduces every weight gradient once (4 B per parameter); spatial parallelism exchanges, per
    conv, two rows forward and two back (none back for the first layer), each a local batch x channels x width slab,
    and allreduces every gradient (the dense head runs batch-parallel): what the harness hands MPI per rank is that,
    and what was priced."""
    script = tmp_path / "bytes.py"
    script.write_text(SCRIPT)
    spec = "cnn:batch=4,image=8,channels=4,convs=8-p-8,dense=8"
    proc = subprocess.run([*mpiexec_argv(ranks), sys.executable, str(script), mesh,
                           calibration(tmp_path / "cal.json"), spec, strategies],
                          env=mpi_env(), cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    params = 4 * 8 * 9 + 8 * 8 * 9 + 8 * 4 * 4 * 8     # conv1, conv2, the dense layer (8 channels of 4 x 4)
    batch = 4 // (2 if mesh == "2x2" else 1)                   # data+spatial: the batch split on axis 0
    # slabs of (batch, channels, 1 row, width): conv1 2 forward (the first layer computes no input gradient), conv2 4
    halo = 4 * batch * (2 * 4 * 8 + 4 * 8 * 4)
    for sid, counts in got.items():
        assert counts["sent"] == {k: v for k, v in counts["priced"].items() if v}, sid
        if "x" not in mesh:          # a 2-d mesh's plan may reduce-scatter on one axis and allreduce half on the other
            assert counts["sent"]["allreduce"] == 4 * params, sid
        assert counts["sent"].get("sendrecv", 0) == (halo if "spatial" in sid else 0), sid


def test_bench_paradl_prints_the_table_from_a_calibration(tmp_path):
    cal, spec = calibration(tmp_path / "cal.json"), "cnn:batch=4,image=8,channels=4,convs=8-p,dense=8"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.paradl", "--launch", shlex.join(mpiexec_argv(4)),
                           "--calibration", cal, "--model", spec,
                           "--out", str(tmp_path / "b"), "--validate-args", shlex.join(FAST), "--repeat", "2"],
                          env=mpi_env(), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    both = pd.read_csv(tmp_path / "b" / "paradl.csv")
    table, second = both[both["run"] == 1].reset_index(), both[both["run"] == 2].reset_index()
    assert list(table["strategy"]) == list(second["strategy"]) == ["data", "filter", "channel", "spatial", "pipeline",
                                                                   "data+filter", "data+spatial"]
    m1, m2 = table["measured_s"], second["measured_s"]        # run 1 scored as the prediction of run 2
    assert table["repeat_accuracy"].to_numpy() == pytest.approx((1 - (m1 - m2).abs() / m2).to_numpy())
    assert second["repeat_accuracy"].isna().all() and len(list((tmp_path / "b").glob("*-2x2-2/summary.json"))) == 1
    assert (table["measured_s"] > 0).all() and table["predicted_s"].gt(0).all()
    want = 1 - (table["predicted_s"] - table["measured_s"]).abs() / table["measured_s"]
    assert table["accuracy"].to_numpy() == pytest.approx(want.to_numpy(), rel=1e-12)   # a CSV's floats, re-parsed
    profile = load_profile(tmp_path / "b" / "profile.json")          # compute from the profile the run made
    pipe, rates = (pipeline(spec, load_calibration(cal), parse_mesh("4", 4, 4), PIPELINE_MICRO_BATCHES,
                            PIPELINE_SCHEDULE, profile=pf) for pf in (profile, None))
    row = table[table["strategy"] == "pipeline"]
    assert row["predicted_s"].item() == pytest.approx(pipe.total_s) and row["rates_s"].item() == pytest.approx(
        rates.total_s) and pipe.total_s != pytest.approx(rates.total_s)    # the calibration's rates alone beside it
    lines = proc.stdout.splitlines()
    mean = next(l for l in lines if l.startswith("mean "))
    assert "86.74%" in mean and "7 strategies measured" in mean
    row = next(l for l in lines if l.startswith("pipeline ") and "%" in l and "ms" not in l).split()
    pipes = both[both["strategy"] == "pipeline"]                     # the mean over both runs, then the repeat's
    assert row[1] == f"{100 * pipes['accuracy'].mean():.2f}%" and row[2] == "90.22%"
    assert row[-1] == f"{100 * pipes['repeat_accuracy'].dropna().item():.2f}%"


@pytest.mark.parametrize("args,says", [
    (["--model", "vgg-small", "--mesh", "2", "--strategies", "data+filter"], "does not run on a 1-d mesh"),
    (["--model", "cnn:image=6,convs=4-p", "--mesh", "2"], "cannot be pooled"),
    (["--model", "cnn:batch=4,image=4,convs=4,dense=4,bn=1", "--mesh", "2", "--strategies", "pipeline"], "batch norm"),
    (["--model", "vgg-small", "--mesh", "2", "--training", "transformer"], "not both")])
def test_bad_network_input_is_one_line_and_exit_2(tmp_path, args, says):
    proc = run_mpi(2, ["validate", calibration(tmp_path / "cal.json"), "--out", str(tmp_path / "v"), *args, *FAST])
    lines = [l for l in proc.stderr.splitlines() if l.startswith("commcal: error")]
    assert proc.returncode == 2 and len(lines) == 1 and says in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "v").exists()
