"""`commcal calibration from-spec SPEC --refine RUN...`: a spec refined by measurements, on the nccl-tests logs of
tests/data/peers imported into run directories (the shipped Selene spec) and on synthetic sweeps (a small spec):
measured (op, link) priced as `commcal fit` prices them, the rest as the spec does, sources named, bad input one
line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calib.calibration import load_calibration
from calib.synthetic import write_synthetic_run
from conftest import run_main

NCCL = Path(__file__).parent / "data" / "peers" / "nccl-tests-synthetic"
OSU = Path(__file__).parent / "data" / "peers" / "osu-7.5"
SMALL_SPEC = {
    "schema": "commcal.spec", "version": 1, "machine": "small", "backend": "mpi",
    "tiers": [{"name": "shm", "devices": 4, "bandwidth_GBps": 10, "efficiency": 0.5, "latency_us": 3},
              {"name": "net", "devices": 16, "bandwidth_GBps": 1, "efficiency": 0.8, "latency_us": 20}],
    "device": {"memory_GiB": 16, "memory_GBps": 50, "memory_efficiency": 0.8,
               "peak_tflops": {"float32": 0.1, "float64": 0.05}, "gemm_max_efficiency": 0.9, "gemm_half_gflop": 0.01,
               "sms": 4, "gemm_tile": [64, 64]}}


def imported(capsys, tmp_path: Path, name: str, logs: list[Path], *flags: str) -> Path:
    out = tmp_path / name
    code, _, err = run_main(capsys, ["import", *map(str, logs), "--out", str(out), *flags])
    assert code == 0, err
    return out


def written(capsys, args: list[str], out: Path) -> dict:
    """Run a command that writes the calibration `out` and read it back."""
    code, _, err = run_main(capsys, [*args, "--out", str(out)])
    assert code == 0, err
    return json.loads(out.read_text())


@pytest.fixture
def selene_refined(capsys, tmp_path):
    """(directory of refined.json, fit.json and spec.json, the imported run's id, the refined calibration): the
    Selene spec refined by an import of nccl-tests' intra-node all-reduce and inter-node send/recv, the plain fit
    of that run, and the plain spec."""
    run = imported(capsys, tmp_path, "nccl", [NCCL / "all_reduce_perf-1node-2ranks.txt",
                                              NCCL / "sendrecv_perf-2nodes-I.json"])
    refined = written(capsys, ["calibration", "from-spec", "selene", "--refine", str(run)], tmp_path / "refined.json")
    fitted = written(capsys, ["fit", str(run), "--quiet"], tmp_path / "fit.json")
    written(capsys, ["calibration", "from-spec", "selene"], tmp_path / "spec.json")
    return tmp_path, fitted["provenance"]["run_ids"][0], refined


def test_measured_op_priced_as_fit_prices_it(selene_refined):
    """(a) Where the runs measured, the refined calibration predicts what a plain fit of the same runs predicts, at
    the measured process count and beyond it; the spec's price there was different."""
    tmp, _, _ = selene_refined
    ref, fit, spec = (load_calibration(tmp / f"{n}.json") for n in ("refined", "fit", "spec"))
    for op, link, procs in (("allreduce", "intra", 2), ("allreduce", "intra", 8), ("sendrecv", "inter", 2)):
        for n in (1024, 1 << 20, 64 << 20):
            want = fit.predict(op, link, procs, n)
            got = ref.predict(op, link, procs, n)
            assert (got.seconds, got.low_s, got.high_s) == (want.seconds, want.low_s, want.high_s)
            assert abs(got.seconds / spec.predict(op, link, procs, n).seconds - 1) > 0.05
    assert ref.result.hockney == fit.result.hockney


def test_unmeasured_op_keeps_the_spec_price(selene_refined):
    """(b) Operations and link classes the runs did not measure, and the GEMM and copy rates, are the spec's."""
    tmp, _, _ = selene_refined
    ref, spec = load_calibration(tmp / "refined.json"), load_calibration(tmp / "spec.json")
    for op, link in (("allreduce", "inter"), ("reduce_scatter", "intra"), ("allgather", "spread"),
                     ("sendrecv", "intra"), ("pingpong", "inter")):
        for procs, n in ((8, 1 << 20), (64, 1 << 30)):
            procs = min(procs, 8) if link == "intra" else procs
            assert ref.predict(op, link, procs, n) == spec.predict(op, link, procs, n)
    assert ref.gemm_flops_per_s("float16") == spec.gemm_flops_per_s("float16")
    assert ref.gemm_wave("float16") == spec.gemm_wave("float16") and ref.copy_cost() == spec.copy_cost()
    assert ref.memory_bytes() == spec.memory_bytes() and ref.link_classes() == spec.link_classes()


def test_sources_and_provenance(selene_refined):
    """(c) Each model and rate names its source; provenance lists the spec first, then the runs; version 15."""
    tmp, run_id, data = selene_refined
    assert data["version"] == 20 and data["backend"] == "nccl"
    assert data["provenance"]["run_ids"] == ["spec-selene", run_id]
    first, run = data["provenance"]["runs"]
    assert first["origin"]["spec"]["file"] == "selene" and run["origin"]["peer"] == "nccl-tests"
    spec = {"kind": "spec", "run_ids": ["spec-selene"]}
    sources = {(op, link): m["source"] for op, by in data["models"].items() for link, m in by.items()}
    for key in (("allreduce", "intra"), ("sendrecv", "inter")):
        assert sources.pop(key) == {"kind": "measured", "run_ids": [run_id]}
    assert sources and all(s == spec for s in sources.values())
    assert all(g["source"] == spec for g in data["compute"]["gemm"].values())
    assert data["compute"]["copy"]["source"] == spec
    assert "refined by the measured runs" in data["warnings"][0] and "allreduce/intra" in data["warnings"][0]


def test_refined_calibration_reads_everywhere(capsys, selene_refined):
    """table, predict, search and export read a refined calibration."""
    tmp, _, _ = selene_refined
    cal = str(tmp / "refined.json")
    for args in (["table", cal], ["predict", cal, "--op", "allreduce", "--link", "intra", "--procs", "2",
                                  "--bytes", "1M"],
                 ["search", cal, "--model", "gpt3-175b", "--devices", "64", "--gpus-per-node", "8", "--top", "1"],
                 ["export", cal, "--format", "simai", "--out", str(tmp / "busbw.yaml")]):
        code, out, err = run_main(capsys, args)
        assert code == 0 and out, (args, err)
        if args[0] == "search":
            assert "(from the spec selene, refined by 1 measured run(s))" in out, out


def test_measured_gemm_and_copy_replace_the_spec_rates(capsys, tmp_path):
    """Two sweeps: one's GEMM (float32) and copy rates replace the spec's, the spec's wave kept, float64 stays the
    spec's; the other's inter all-reduce is added to a 1-tier spec, which had no inter class; each names its run."""
    spec_file = tmp_path / "small.json"
    spec_file.write_text(json.dumps({**SMALL_SPEC, "tiers": SMALL_SPEC["tiers"][:1]}))
    comm = write_synthetic_run(tmp_path / "comm", {("allreduce", "inter"): (30e-6, 2e-9)}, {"inter": [2, 4]},
                               run_id="sweep1")
    local = write_synthetic_run(tmp_path / "local", {}, {"intra": [2]}, gemm={"float32": 5e10}, copy=(1e-6, 2e10),
                                run_id="sweep2")
    data = written(capsys, ["calibration", "from-spec", str(spec_file), "--refine", str(comm), str(local)],
                   tmp_path / "r.json")
    fit = written(capsys, ["fit", str(comm), str(local), "--quiet"], tmp_path / "f.json")
    assert data["provenance"]["run_ids"] == ["spec-small", "sweep1", "sweep2"]
    gemm = data["compute"]["gemm"]
    measured = {"kind": "measured", "run_ids": ["sweep2"]}
    assert gemm["float32"] == {**fit["compute"]["gemm"]["float32"], "wave_tiles": 4, "tile_rows": 64,
                               "tile_cols": 64, "source": measured}
    assert gemm["float64"]["flops_per_s"] == pytest.approx(0.05e12 * 0.9) and gemm["float64"]["source"]["kind"] == \
        "spec"
    assert data["compute"]["copy"] == {**fit["compute"]["copy"], "source": measured}
    assert data["link_classes"]["inter"] == fit["link_classes"]["inter"]
    assert data["models"]["allreduce"]["inter"] == {**fit["models"]["allreduce"]["inter"],
                                                    "source": {"kind": "measured", "run_ids": ["sweep1"]}}
    plain = written(capsys, ["calibration", "from-spec", str(spec_file)], tmp_path / "s.json")
    assert "inter" not in plain["link_classes"]


def bad_cases(capsys, tmp_path: Path) -> list[tuple[list[str], str]]:
    """(command arguments, words the error line must hold) for each kind of bad input."""
    osu = imported(capsys, tmp_path, "osu", [OSU / "osu_latency.txt"], "--link", "intra")
    small = tmp_path / "small.json"
    small.write_text(json.dumps(SMALL_SPEC))
    f16 = tmp_path / "f16.json"
    f16.write_text(json.dumps({**SMALL_SPEC, "device": {**SMALL_SPEC["device"], "peak_tflops": {"float16": 1}}}))
    gemm32 = write_synthetic_run(tmp_path / "g32", {}, {"intra": [2]}, gemm={"float32": 5e10}, run_id="g32")
    fast = write_synthetic_run(tmp_path / "fast", {}, {"intra": [2]}, gemm={"float32": 5e12}, run_id="fast")
    short = write_synthetic_run(tmp_path / "short", {("allreduce", "intra"): (5e-6, 1e-9)}, {"intra": [2]},
                                sizes=(8, 1024), run_id="short")
    level = write_synthetic_run(tmp_path / "level", {("allreduce", "inter2"): (5e-6, 1e-9)}, {"inter2": [2, 4]},
                                run_id="level")
    spec = ["calibration", "from-spec"]
    flat, huge = (tmp_path / f"{name}.json" for name in ("flat", "huge"))
    flat.write_text(json.dumps({**SMALL_SPEC, "tiers": [SMALL_SPEC["tiers"][0]] * 2}))
    huge.write_text(json.dumps({**SMALL_SPEC, "tiers": [SMALL_SPEC["tiers"][0],
                                                        {**SMALL_SPEC["tiers"][1], "devices": 4 * 10 ** 30}]}))
    return [([*spec, str(flat)], "tiers[1].devices (4) must be a multiple of a node's 4 (tiers[0].devices) and more "
                                 "than it"),
            ([*spec, str(huge)], "tiers[1]: key 'devices' must be an integer from 2 to 1048576"),
            ([*spec, "selene", "--refine", str(osu)], "measured backend mpi, the spec selene is nccl"),
            ([*spec, str(f16), "--refine", str(gemm32)], "float32 GEMMs, a dtype the spec states no peak for"),
            ([*spec, str(small), "--refine", str(fast)], "above the spec's peak"),
            ([*spec, str(small), "--refine", str(short)], "nothing could be fitted"),
            ([*spec, str(small), "--refine", str(level)], "link class inter2"),
            ([*spec, str(small), "--refine", str(tmp_path / "nowhere")], "not a commcal run directory")]


def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path):
    """(d) A backend or dtype the spec contradicts, a run that cannot be fitted, a switch level, a missing run:
    exit 2, one line on stderr, no traceback, no calibration written."""
    for args, words in bad_cases(capsys, tmp_path):
        out = tmp_path / "bad.json"
        code, _, err = run_main(capsys, [*args, "--out", str(out)])
        assert code == 2 and err.startswith("commcal: error: ") and err.count("\n") == 1, (args, err)
        assert words in err, err
        assert not out.exists()
