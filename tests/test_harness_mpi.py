"""The harness's step executor on real ranks: every redistribution plan analysis makes on meshes 2x2 and 4
(all source/target signature pairs of a 2-d tensor) turns each rank's block into its target block."""

import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, mpi_env, mpiexec_argv

pytestmark = pytest.mark.mpi

SCRIPT = textwrap.dedent("""
    import itertools, sys
    import numpy as np
    from mpi4py import MPI
    from analysis.harness_comm import Collectives, job_mesh
    from analysis.harness_exec import run_step
    from analysis.redistribute import plan
    from analysis.sbp import B, P, Split, fmt, local_slices

    world = MPI.COMM_WORLD
    mesh, coord, _ = job_mesh(world, sys.argv[1])
    coll = Collectives(world, mesh, coord)
    shape = (8, 12)
    data = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    sigs = list(itertools.product([B, P, Split(0), Split(1)], repeat=len(mesh.shape)))
    ran = bad = 0
    for src, dst in itertools.product(sigs, sigs):
        pl = plan(shape, 4, src, dst, mesh)
        if not pl.feasible:
            continue
        buf = np.ascontiguousarray(data[local_slices(shape, src, mesh.shape, coord)])
        for axis, p in enumerate(src):
            if p == P and coord[axis] != 0:
                buf = np.zeros_like(buf)
        for st in pl.steps:
            buf = run_step(st, buf, coll, coord)
        for axis, p in enumerate(dst):
            if p == P:
                buf = coll.allreduce(np.ascontiguousarray(buf), axis)
        want = data[local_slices(shape, dst, mesh.shape, coord)]
        ok = buf.shape == want.shape and np.allclose(buf, want, atol=1e-5)
        if not ok and world.rank == 0:
            print("WRONG", fmt(src), "->", fmt(dst), [s.op for s in pl.steps])
        bad += not ok
        ran += 1
    bad = world.allreduce(bad)
    if world.rank == 0:
        print("plans", ran, "wrong", bad)
    sys.exit(1 if bad else 0)
""")


@pytest.mark.parametrize("ranks,mesh", [(4, "2x2"), (4, "4"), (2, "2")])
def test_every_plan_executes_to_its_target(tmp_path, ranks, mesh):
    script = tmp_path / "plans.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([*mpiexec_argv(ranks), sys.executable, str(script), mesh], env=mpi_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    count = int(proc.stdout.split("plans ")[1].split()[0])
    assert count >= (200 if mesh == "2x2" else 12)
