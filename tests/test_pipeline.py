"""The pipeline harness: the schedules' per-device orders played give the bubble the model prices; the transformer
block's backward is the gradient of its forward; on 4 real ranks a training step of every (p, t, d) mix, with GPipe,
1F1B and interleaved schedules and ZeRO 1, runs the passes in the schedule's order and matches one float64 process;
`commcal validate --training` ranks configurations with validate's metrics (bad input: one line, exit 2)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

from analysis.harness import TOLERANCE
from analysis.harness_pipeline import TransformerStack, reference
from analysis.schedules import Pass, Schedule, play
from analysis.training import Step
from analysis.validate_plan import training_configs
from calib.synthetic import synthetic_calibration
from conftest import REPO, mpi_env, mpiexec_argv, run_mpi

SCHEDULES = [Schedule("gpipe"), Schedule("1f1b"), Schedule("interleaved", 2), Schedule("interleaved", 3)]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=str)
def test_played_orders_idle_for_the_priced_bubble(schedule):
    """Each device runs every pass once; played with forward 1 and backward 2 (any ratio), the step takes m stage
    slots plus exactly bubble_slots(p)."""
    for p in (1, 2, 3, 4, 8):
        for m in (1, 2, 3, 4, 8, 12):
            if schedule.problem(p, m, p * schedule.v * 2) or (schedule.v > 1 and m < p):
                continue
            orders = [schedule.order(p, m, r) for r in range(p)]
            for r, order in enumerate(orders):
                want = {Pass(k, i, c) for k in "FB" for i in range(m) for c in range(schedule.v)}
                assert len(order) == len(want) and set(order) == want, (p, m, r)
            for fwd, bwd in ((1.0, 2.0), (1.0, 1.0), (0.3, 0.9)):
                bubble = (play(orders, schedule.v, fwd, bwd) - m * (fwd + bwd)) / (fwd + bwd)
                assert bubble == pytest.approx(schedule.bubble_slots(p)), (p, m, fwd, bwd)


def test_one_f_one_b_holds_at_most_p_micro_batches_and_deadlocks_are_caught():
    order = Schedule("1f1b").order(4, 8, 0)
    live = peak = 0
    for kind, _, _ in order:
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    assert peak == 4 == Schedule("1f1b").in_flight(4, 8)
    assert max(np.cumsum([1 if k == "F" else -1 for k, _, _ in Schedule("gpipe").order(4, 8, 0)])) == 8
    swapped = [Schedule("1f1b").order(2, 2, r) for r in range(2)]
    swapped[1] = swapped[1][::-1]          # backward before its own forward
    with pytest.raises(ValueError, match="deadlock"):
        play(swapped, 1)


def test_block_backward_is_the_gradient_of_its_forward():
    stack = TransformerStack(2, 8, 2, 16, 4, 2)
    data = stack.data(1)
    _, grads = reference(stack, data)
    loss = lambda: float((reference(stack, data)[0] * data["R"]).sum())  # noqa: E731
    for layer in (0, 1):
        for name in ("qkv", "proj", "fc1", "fc2"):
            w, idx, eps = data["weights"][layer][name], (1, 2), 1e-6
            w[idx] += eps
            up = loss()
            w[idx] -= 2 * eps
            down = loss()
            w[idx] += eps
            assert (up - down) / (2 * eps) == pytest.approx(grads[layer][name][idx], rel=1e-5, abs=1e-8)


def test_default_configurations_cover_every_mix_of_four_devices():
    mixes = {(c.p, c.t, c.d) for c in training_configs(4)}
    assert mixes == {(4, 1, 1), (2, 1, 2), (2, 2, 1), (1, 2, 2), (1, 4, 1), (1, 1, 4)}
    assert {str(c.schedule) for c in training_configs(4) if c.p > 1} == {"1f1b", "interleaved/v2"}


SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from mpi4py import MPI
    from analysis.harness_comm import Collectives, job_mesh
    from analysis.harness_pipeline import Place, TrainStep, TransformerStack, reference
    from analysis.training import parse_config

    class Logged(TransformerStack):
        '''The transformer's layers, each forward and backward logged: the passes as the executor runs them.'''
        def layer(self, i, params, allreduce, xp=np):
            inner = super().layer(i, params, allreduce, xp)
            class Layer:
                def forward(self, x):
                    LOG.append(("F", i))
                    return inner.forward(x)
                def backward(self, ctx, dy):
                    LOG.append(("B", i))
                    return inner.backward(ctx, dy)
            return Layer()

    LOG = []
    world = MPI.COMM_WORLD
    stack = Logged(8, 16, 4, 32, 8, 8)
    data = stack.data(3)
    want = reference(stack, data)
    out = []
    for text in sys.argv[1:]:
        c = parse_config(text)
        m = stack.batch // (c.d * c.micro_batch)
        mesh, coord, _ = job_mesh(world, f"{c.p}x{c.d}x{c.t}")
        coll = Collectives(world, mesh, coord)
        LOG = []
        step = TrainStep(stack, data, c, Place(*coord, m), coll)
        err = coll.world_max(step.errors(data, want))
        per = stack.layers // (c.p * c.schedule.v)
        firsts = [(k, i) for k, i in LOG if (i % per == 0 if k == "F" else i % per == per - 1)]
        seen = {}
        executed = []
        for k, i in firsts:
            chunk = i // per // c.p
            seen[(k, chunk)] = seen.get((k, chunk), -1) + 1
            executed.append([k, seen[(k, chunk)], chunk])
        for phase, run in step.phases():
            run()
        copies = world.allgather((coord[0], coord[2], np.asarray(step.flat.params)))
        same = all(np.array_equal(a, step.flat.params) for s, t, a in copies if (s, t) == (coord[0], coord[2]))
        moved = not np.allclose(step.flat.params, step.flat.flatten([stack.shard(i, data["weights"][i], c.t, coord[2])
                                                                     for i in step.indices]), rtol=0, atol=1e-7)
        orders = world.gather((coord, executed), root=0)
        out.append({"config": text, "errors": err.tolist(), "same": bool(world.allreduce(int(not same)) == 0),
                    "moved": bool(world.allreduce(int(not moved)) == 0), "orders": orders, "m": m})
        coll.free()
    if world.rank == 0:
        print(json.dumps(out))
""")

MIXES = ["t=1,p=4,d=1,mb=1,schedule=gpipe", "t=1,p=4,d=1,mb=1,schedule=1f1b", "t=1,p=4,d=1,mb=2,schedule=1f1b",
         "t=1,p=2,d=2,mb=1,schedule=interleaved,v=2", "t=2,p=2,d=1,mb=2,schedule=1f1b",
         "t=1,p=4,d=1,mb=1,schedule=interleaved,v=2",
         "t=1,p=2,d=2,mb=1,schedule=1f1b,zero=1", "t=2,p=1,d=2,mb=2,zero=1", "t=4,p=1,d=1,mb=2",
         "t=1,p=1,d=4,mb=1", "t=1,p=2,d=2,mb=1,overlap=1", "t=2,p=1,d=2,mb=2,overlap=1"]


@pytest.mark.mpi
def test_training_step_of_every_mix_matches_one_process_in_the_schedules_order(tmp_path):
    """4 ranks: outputs and reduced gradients within float32's tolerance of one float64 process; every device ran
    exactly its Schedule.order, whose played bubble is the priced one; after the update every data-parallel replica
    holds the same (changed) parameters."""
    script = tmp_path / "pipe.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([*mpiexec_argv(4), sys.executable, str(script), *MIXES], env=mpi_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    from analysis.training import parse_config

    for res in json.loads(proc.stdout.strip().splitlines()[-1]):
        c = parse_config(res["config"])
        assert max(res["errors"]) <= TOLERANCE["float32"] and res["same"] and res["moved"], res
        orders = {}
        for (stage, replica, member), executed in res["orders"]:
            assert [Pass(*e) for e in executed] == list(c.schedule.order(c.p, res["m"], stage)), res["config"]
            orders[stage] = tuple(Pass(*e) for e in executed)
        played = play([orders[s] for s in range(c.p)], c.schedule.v)
        assert (played - 3 * res["m"]) / 3 == pytest.approx(c.schedule.bubble_slots(c.p))


OPS = ("allreduce", "allgather", "reduce_scatter", "alltoall", "pingpong")
MODEL = "transformer:d=16,heads=4,layers=8,seq=8,batch=8"
FAST = ["--budget", "0.01", "--min-samples", "2", "--target-ci", "0.5", "--bootstrap", "50", "--rounds", "2"]


def calibration(path) -> str:
    models = {(op, "intra"): (5e-6, 1e-9) for op in OPS}
    path.write_text(json.dumps(synthetic_calibration(models, links={"intra": [2, 4]},
                                                     gemm={"float32": 1e10, "float64": 5e9})))
    return str(path)


@pytest.mark.mpi
def test_validate_training_ranks_configurations_with_the_ranking_metrics(tmp_path):
    """benchmarks.pipeline with a calibration runs `validate --training` twice on 4 ranks and prints each run's
    metrics and each run scored as the other's prediction; the directory holds predicted and measured parts."""
    cal, out = calibration(tmp_path / "cal.json"), tmp_path / "val" / "validate"
    configs = ["t=1,p=4,d=1,mb=1", "t=2,p=2,d=1,mb=2", "t=1,p=1,d=4,mb=1,zero=1", "t=1,p=1,d=4,mb=1,overlap=1"]
    more = shlex.join([*FAST, *[a for c in configs for a in ("--config", c)]])
    proc = subprocess.run([sys.executable, "-m", "benchmarks.pipeline", "--launch", shlex.join(mpiexec_argv(4)),
                           "--calibration", cal, "--model", MODEL, "--out", str(out.parent), "--validate-args", more],
                          env=mpi_env(), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("numerics ok for all 4 configurations") == 2 and "total_kendall_tau" in proc.stdout
    header = next(line for line in proc.stdout.splitlines() if line.startswith("metric"))
    assert header.split()[1:] == ["run", "1", "run", "2", "1", "as", "2", "2", "as", "1", "target"]
    tau = next(line for line in proc.stdout.splitlines() if line.startswith("kendall_tau")).split()
    assert all(-1 <= float(v) <= 1 for v in tau[1:5])
    frame = pd.read_parquet(out / "strategies.parquet")
    assert len(frame) == 4 and (frame["max_rel_err"] <= TOLERANCE["float32"]).all()
    assert (frame["measured_s"] > 0).all() and (frame["measured_comm_s"] > 0).all() and (frame["samples"] >= 4).all()
    parts = frame[[f"predicted_{k}" for k in Step.PARTS]].sum(axis=1)
    np.testing.assert_allclose(parts, frame["predicted_s"], rtol=1e-9)
    assert frame.loc[frame["p"] == 1, "predicted_bubble_s"].eq(0).all()
    assert frame.loc[frame["p"] == 4, "predicted_bubble_s"].gt(0).all()
    overlap = frame["dp_overlap"]
    assert frame.loc[(frame["d"] == 4) & ~overlap, "measured_reduce_s"].gt(0).all()
    assert frame.loc[overlap, "measured_reduce_s"].eq(0).all() and frame.loc[overlap, "measured_overlap_wait_s"].gt(0).all()
    assert frame.loc[frame["t"] == 1, "measured_tp_s"].eq(0).all()
    steps = pd.read_parquet(out / "steps.parquet")
    assert set(steps["part"]) == {"compute", "tp", "pp+bubble", "dp", "optimizer"} and len(steps) == 4 * 5
    np.testing.assert_allclose(steps.groupby("strategy", sort=False)["predicted_s"].sum().to_numpy(),
                               frame["predicted_s"].to_numpy(), rtol=1e-9)
    summary = json.loads((out / "summary.json").read_text())
    m = summary["metrics"]
    assert {"kendall_tau", "top1", "regret", "mean_accuracy", "comm_kendall_tau"} <= set(m)
    assert -1 <= m["kendall_tau"]["value"] <= 1 and m["regret"]["value"] >= 0 and m["top1"]["value"] in (0.0, 1.0)
    tau = pd.Series(frame["predicted_s"]).corr(frame["measured_s"], method="kendall")
    assert m["kendall_tau"]["value"] == pytest.approx(tau)
    assert summary["strategies_run"] == 4 and summary["training"] == MODEL
    assert json.loads((out / "run.json").read_text())["command"] == "validate"


@pytest.mark.mpi
@pytest.mark.parametrize("args,says", [
    (["--training", MODEL + ",vocab=100"], "give vocab=0"),
    (["--config", "t=1,p=2,d=1,mb=1"], "--config needs --training"),
    (["--training", MODEL, "--config", "t=1,p=3,d=1,mb=1"], "not the 2 devices"),
    (["--training", MODEL, "--layer", "linear"], "not both"),
    (["--training", MODEL, "--config", "t=1,p=1,d=2,mb=1,zero=2"], "ZeRO 0 and 1"),
])
def test_validate_training_bad_input_is_one_line_and_exit_2(tmp_path, args, says):
    proc = run_mpi(2, ["validate", calibration(tmp_path / "cal.json"), "--out", str(tmp_path / "v"), *args, *FAST])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("commcal: error")]
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "v").exists()
