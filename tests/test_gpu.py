"""GPU backends. Without cupy and a CUDA device these skip with the reason; the error paths a
CPU machine can reach are tested here for real."""

import importlib.util

import pytest

from conftest import run_mpi
from microbench.records import load_summary, read_run_json


def _gpu_reason() -> str | None:
    if importlib.util.find_spec("cupy") is None:
        return "cupy is not installed (pip install 'commcal[gpu]' on a machine with an NVIDIA GPU)"
    import cupy

    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device"
    except Exception as exc:  # cupy raises CUDARuntimeError without a driver
        return f"no usable CUDA device ({exc})"
    return None


GPU_REASON = _gpu_reason()
needs_gpu = pytest.mark.skipif(GPU_REASON is not None, reason=GPU_REASON or "")


@pytest.mark.skipif(GPU_REASON is None, reason="this machine has a GPU: the no-GPU error path does not apply")
@pytest.mark.parametrize("backend", ["nccl", "mpi-cuda"])
def test_gpu_backend_without_gpu_is_a_clear_error(tmp_path, backend):
    proc = run_mpi(2, ["sweep", "--out", str(tmp_path / "r"), "--backend", backend, "--ops", "allreduce"])
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("commcal: error:")]
    assert len(errors) == 1 and f"--backend {backend}" in errors[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "r" / "run.json").exists()


def test_in_place_is_only_for_nccl(tmp_path):
    proc = run_mpi(2, ["sweep", "--out", str(tmp_path / "r"), "--in-place", "--ops", "allreduce"])
    assert proc.returncode == 2 and "--in-place applies to --backend nccl" in proc.stderr


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("in_place", [False, True])
def test_nccl_single_rank_sweep_is_correct(tmp_path, in_place):
    """NCCL allows one rank per GPU: on a one-GPU machine every collective runs at p = 1."""
    out = tmp_path / "run"
    args = ["sweep", "--out", str(out), "--backend", "nccl", "--procs", "1", "--sizes", "8,64K,4M",
            "--gemm-sizes", "16M", "--ops", "allreduce,allgather,reduce_scatter,alltoall,bcast,reduce,gemm",
            "--point-budget", "0.2"] + (["--in-place"] if in_place else [])
    proc = run_mpi(1, args, check=True)
    summary = load_summary(out)
    assert (summary.wrong == 0).all(), proc.stdout
    comm = summary[summary.op != "gemm"]
    assert set(comm.op) == {"allreduce", "allgather", "reduce_scatter", "alltoall", "bcast", "reduce"}
    assert set(comm.timing_path) == {"cuda-events"}
    assert comm[comm.op == "allreduce"].in_place.all() == in_place
    gemm = summary[summary.op == "gemm"]
    assert "float32" in set(gemm.dtype) and (gemm.flops_per_s > 1e12).all()
    meta = read_run_json(out)
    assert meta["backend"] == "nccl" and meta["gpus"] and meta["versions"]["cupy"] and meta["versions"]["nccl"]


@pytest.mark.gpu
@needs_gpu
def test_mpi_cuda_backend_runs_or_refuses_clearly(tmp_path):
    proc = run_mpi(1, ["sweep", "--out", str(tmp_path / "r"), "--backend", "mpi-cuda", "--procs", "1",
                       "--ops", "allreduce,bcast", "--sizes", "8,64K", "--point-budget", "0.1"])
    if proc.returncode == 2:
        assert "the MPI library reports no CUDA support" in proc.stderr or "cannot say" in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert (load_summary(tmp_path / "r").wrong == 0).all()


@pytest.mark.gpu
@needs_gpu
def test_gpu_benchmark_prints_figures():
    import subprocess
    import sys

    from conftest import REPO, mpi_env

    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu"], cwd=REPO, env=mpi_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "TFLOP/s" in proc.stdout and "nccl allreduce" in proc.stdout and "GB/s" in proc.stdout
    assert "wrong=0" in proc.stdout and "wrong=1" not in proc.stdout


GPU_ROTATION = """
import time
from mpi4py import MPI
from microbench.backends import NcclBackend
from microbench.buffers import Pool
from microbench.ops import OPS, Layout

world = MPI.COMM_WORLD
backend = NcclBackend(world, [MPI.Get_processor_name()])
timer, _ = backend.make_timer(world, "auto")
op, n = OPS["allreduce"], 6
lay = Layout(n * 4, n * 4, n, n, n, 4)
send, recv = op.fill(backend.xp, lay, "float32", 0, 1)
slots = Pool(backend.xp, 16 * 4096).slots(send, recv)
for i in range(slots.count):
    slots.pair(i)[1][:] = 0
t0 = time.perf_counter()
timer.run(op, world, slots, 11, lay, "float32", slots.count, 0.01)   # from slot 11, wrapping; 10 ms gaps
backend.sync()
spaced = time.perf_counter() - t0 >= 0.16
want = op.expected(backend.xp, lay, "float32", 0, 1)
bad = sum(int((slots.pair(i)[1] != want).any()) for i in range(slots.count))
print("device slots", slots.count, "wrong", bad, "spaced", spaced)
"""


@pytest.mark.gpu
@needs_gpu
def test_nccl_timer_rotates_through_every_cold_device_slot(tmp_path):
    """The cold pool on the GPU: each timed NCCL call gets its own device slot, all 16 written correctly."""
    import os
    import subprocess
    import sys

    from conftest import REPO, mpi_env, mpiexec_argv

    script = tmp_path / "gpu_rotation.py"
    script.write_text(GPU_ROTATION)
    env = mpi_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))  # not installed there
    proc = subprocess.run([*mpiexec_argv(1), sys.executable, str(script)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "device slots 16 wrong 0 spaced True" in proc.stdout, proc.stdout


@pytest.mark.skipif(GPU_REASON is None, reason="this machine has a GPU: the no-GPU error path does not apply")
def test_profile_on_a_gpu_backend_without_gpu_is_a_clear_error(tmp_path):
    proc = run_mpi(2, ["profile", "--model", "vgg-small", "--mesh", "2", "--backend", "nccl",
                       "--out", str(tmp_path / "p.json")])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("commcal: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "--backend nccl" in errors[0]
    assert "Traceback" not in proc.stderr and not (tmp_path / "p.json").exists()


@pytest.mark.gpu
@needs_gpu
def test_profile_times_a_network_s_kernels_on_the_gpu(tmp_path):
    """The kernels of vgg-small's strategies on one GPU: every one the host profile holds, timed on the device."""
    from analysis.kernel_profile import load_profile

    run_mpi(1, ["profile", "--model", "vgg-small", "--mesh", "1", "--backend", "nccl", "--out",
                str(tmp_path / "gpu.json")], check=True)
    run_mpi(1, ["profile", "--model", "vgg-small", "--mesh", "1", "--out", str(tmp_path / "host.json")], check=True)
    gpu, host = load_profile(tmp_path / "gpu.json"), load_profile(tmp_path / "host.json")
    assert gpu.backend == "nccl" and host.backend == "mpi"
    assert {k.key for k in gpu.kernels} == {k.key for k in host.kernels}
    assert all(k.median_s > 0 for k in gpu.kernels)
