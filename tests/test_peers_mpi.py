"""Reference modes and the thread level on real 2-rank mpirun jobs: `sweep --method osu|osu-window|imb` runs, times
the peer's way in the peer's size convention and records its method; run.json records the thread level asked for
and provided; fit refuses to mix methods unless told to."""

import json

import pytest

from conftest import mpi_env, run_cli, run_main, run_mpi
from microbench.records import load_summary, read_run_json

pytestmark = pytest.mark.mpi
FAST = ["--point-budget", "0.05", "--min-samples", "6", "--target-ci", "0.5", "--rounds", "1", "--retries", "0"]


def _env(**extra):
    env = mpi_env()
    env.pop("MPI4PY_RC_THREAD_LEVEL", None)
    return env | extra


def test_method_osu_runs_in_osus_convention_and_records_its_method(tmp_path):
    out = tmp_path / "osu"
    proc = run_mpi(2, ["sweep", "--out", str(out), "--method", "osu", "--ops", "pingpong,allgather,alltoall,"
                       "reduce_scatter,allreduce", "--sizes", "8,64K", *FAST], check=True, env=_env())
    meta = read_run_json(out)
    assert meta["options"]["method"] == "osu" and meta["options"]["cache"] == "warm"
    assert meta["mpi_thread_level"] == {"requested": "single", "chosen_by": "commcal (one thread calls MPI)",
                                        "provided": "single"}
    s = load_summary(out).set_index(["op", "requested_bytes"])
    assert (s["wrong"] == 0).all() and set(s["dtype"]) == {"int8", "int32"}
    assert s.loc[("allgather", 8), "size_bytes"] == 16 and s.loc[("alltoall", 65536), "size_bytes"] == 131072
    assert s.loc[("allreduce", 8), "size_bytes"] == 8 and s.loc[("reduce_scatter", 8), "size_bytes"] == 8
    assert (s["samples"] >= 6).all() and (s["median_s"] > 0).all()
    assert "method osu" in proc.stdout


def test_window_and_imb_methods_run(tmp_path):
    run_mpi(2, ["sweep", "--out", str(tmp_path / "bw"), "--method", "osu-window", "--sizes", "8,1M", *FAST],
            check=True, env=_env())
    bw = load_summary(tmp_path / "bw").set_index("requested_bytes")
    assert set(bw["op"]) == {"pingpong"} and (bw["wrong"] == 0).all()
    assert bw.loc[1 << 20, "median_s"] < 1e-2          # per message: a window keeps 64 in flight
    run_mpi(2, ["sweep", "--out", str(tmp_path / "imb"), "--method", "imb", "--ops", "reduce_scatter,bcast",
                "--sizes", "8,4K", *FAST], check=True, env=_env())
    imb = load_summary(tmp_path / "imb")
    assert (imb["wrong"] == 0).all() and set(imb["dtype"]) == {"float32", "uint8"}
    assert read_run_json(tmp_path / "imb")["options"]["method"] == "imb"


def test_thread_level_is_chosen_recorded_and_overridable(tmp_path):
    base = ["--ops", "pingpong", "--sizes", "8", *FAST]
    run_mpi(2, ["sweep", "--out", str(tmp_path / "env"), *base], check=True,
            env=_env(MPI4PY_RC_THREAD_LEVEL="multiple"))
    level = read_run_json(tmp_path / "env")["mpi_thread_level"]
    assert level["requested"] == "multiple" and level["chosen_by"] == "MPI4PY_RC_THREAD_LEVEL"
    run_mpi(2, ["sweep", "--out", str(tmp_path / "opt"), "--thread-level", "funneled", *base], check=True,
            env=_env(MPI4PY_RC_THREAD_LEVEL="multiple"))
    level = read_run_json(tmp_path / "opt")["mpi_thread_level"]
    assert level["requested"] == "funneled" and level["chosen_by"] == "--thread-level"
    assert level["provided"] in ("funneled", "serialized", "multiple")


def test_fit_refuses_a_mix_of_methods_unless_allowed(tmp_path, capsys):
    for method in ("commcal", "osu"):
        run_mpi(2, ["sweep", "--out", str(tmp_path / method), "--method", method, "--cache", "warm", "--ops",
                    "allreduce", "--sizes", "8,1K,8K,64K,256K", *FAST], check=True, env=_env())
    runs = [str(tmp_path / "commcal"), str(tmp_path / "osu")]
    code, _, err = run_main(capsys, ["fit", *runs, "--out", str(tmp_path / "cal.json")])
    assert code == 2 and "runs mix timing methods commcal and osu" in err
    code, _, err = run_main(capsys, ["fit", *runs, "--mix-methods", "--out", str(tmp_path / "cal.json")])
    assert code == 0, err
    cal = json.loads((tmp_path / "cal.json").read_text())
    assert [r["method"] for r in cal["provenance"]["runs"]] == ["commcal", "osu"]
    assert all(r["mpi_thread_level"] == {"requested": "single", "provided": "single"} for r in cal["provenance"]["runs"])


def test_reference_mode_refuses_cold_buffers(tmp_path):
    proc = run_mpi(2, ["sweep", "--out", str(tmp_path / "x"), "--method", "osu", "--cache", "cold", *FAST],
                   env=_env())
    assert proc.returncode == 2 and "back to back on warm buffers" in proc.stderr
