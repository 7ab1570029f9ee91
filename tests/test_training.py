"""The training-step model: schedule bubbles and in-flight micro-batches, memory by ZeRO stage and activations by
hand, infeasibility reasons, a spec calibration, and the search and predict front doors on a synthetic and a spec
calibration (bad input: one line, exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.schedules import Schedule, parse_schedule
from analysis.training import Config, TrainingPricer, Transformer, parse_config, space
from calib.calibration import calibration_from_dict, load_calibration
from calib.spec import from_spec, load_spec
from calib.synthetic import synthetic_calibration
from microbench.errors import UsageError
from conftest import run_main

OPS = ("allreduce", "allgather", "reduce_scatter", "alltoall", "pingpong", "sendrecv")
GPT = "transformer:d=1024,heads=16,layers=8,seq=512,batch=32,vocab=1000"


def synthetic(backend: str = "mpi"):
    models = {(op, link): (a, 1 / bw) for op in OPS
              for link, a, bw in (("intra", 5e-6, 100e9), ("inter", 20e-6, 12e9), ("spread", 25e-6, 10e9))}
    return calibration_from_dict(synthetic_calibration(models, gemm={"float32": 1e13}, backend=backend))


def test_bubbles_and_in_flight():
    assert Schedule("gpipe").bubble_slots(4) == Schedule("1f1b").bubble_slots(4) == 3
    assert Schedule("interleaved", 3).bubble_slots(4) == 1
    assert Schedule("gpipe").in_flight(4, 16) == 16 and Schedule("1f1b").in_flight(4, 16) == 4
    assert Schedule("1f1b").in_flight(4, 2) == 2
    assert Schedule("interleaved", 2).in_flight(4, 16) == pytest.approx(4 * (1 + 3 / 8))
    assert Schedule("interleaved", 2).messages(4, 8) == 2 * (2 * 8 + 3) and Schedule("1f1b").messages(1, 8) == 0
    assert parse_schedule("interleaved/v3") == Schedule("interleaved", 3)
    with pytest.raises(UsageError, match="only interleaved"):
        Schedule("1f1b", 2)


def test_memory_by_zero_stage_by_hand():
    model = Transformer.parse(GPT)
    tp = TrainingPricer(synthetic(), model, 8, 4, "float32")
    h, f = 1024, 4096
    stage = (8 // 2 * (4 * h * h + 2 * h * f + 9 * h + f) + (1000 + 512) * h) / 2      # t=2, p=2
    for zero, (pw, gw, ow) in {0: (1, 1, 1), 1: (1, 1, 2), 2: (1, 2, 2), 3: (2, 2, 2)}.items():
        mem = tp.memory(Config(2, 2, 2, 1, zero=zero), 16)
        assert (mem.params, mem.grads, mem.optimizer) == pytest.approx((2 * stage / pw, 2 * stage / gw, 12 * stage / ow))
    sbh = 512 * 1 * h
    none = tp.memory(Config(2, 2, 2, 1), 16).activations
    assert none == pytest.approx(4 * sbh * (10 + (24 + 5 * 16 * 512 / h) / 2) * 2)     # 4 layers x p=2 in flight
    sel_sp = tp.memory(Config(2, 2, 2, 1, sp=True, recompute="selective"), 16).activations
    assert sel_sp == pytest.approx(4 * sbh * 34 / 2 * 2)


def test_infeasible_configurations_say_why():
    tp = TrainingPricer(synthetic(), Transformer.parse(GPT), 8, 4, "float32", memory_bytes=2 ** 20)
    reasons = {
        "t=3,p=1,d=1,mb=1": "not the 8 devices", "t=8,p=1,d=1,mb=1,sp=1": None,
        "t=1,p=8,d=1,mb=1,sp=1": "needs tensor parallelism", "t=8,p=1,d=1,mb=1,zero=1": "needs d > 1",
        "t=1,p=1,d=8,mb=3": "does not split", "t=2,p=4,d=1,mb=1,schedule=interleaved,v=4": "do not split into v=4",
    }
    for text, words in reasons.items():
        step = tp.price(parse_config(text))
        assert not step.feasible
        assert words is None or words in step.reason
    assert "over the device's" in tp.price(parse_config("t=8,p=1,d=1,mb=1,sp=1")).reason


def test_step_adds_up_and_overlap_hides():
    tp = TrainingPricer(synthetic("nccl"), Transformer.parse(GPT), 8, 4, "float32")
    for sched in ("gpipe", "1f1b", "interleaved"):
        off = tp.price(Config(2, 2, 2, 2, parse_schedule(sched, 2), 0))
        on = tp.price(Config(2, 2, 2, 2, parse_schedule(sched, 2), 0, dp_overlap=True))
        assert off.total_s == pytest.approx(sum(getattr(off, k) for k in off.PARTS))
        assert on.dp_exposed_s + on.dp_overlapped_s == pytest.approx(off.dp_exposed_s) and on.total_s <= off.total_s
        assert off.links == {"tp": "intra", "pp": "inter", "dp": "intra"}


def test_overlap_hides_nothing_on_host_mpi_and_pays_a_call_per_layer():
    """Host MPI advances a non-blocking all-reduce only inside MPI calls: overlap leaves every layer's all-reduce
    exposed at the final wait, each with its latency, so it costs more than one all-reduce after the passes."""
    model = Transformer.parse(GPT)
    tp = TrainingPricer(synthetic("mpi"), model, 8, 4, "float32")
    off = tp.price(Config(2, 2, 2, 2, parse_schedule("1f1b", 2), 0))
    on = tp.price(Config(2, 2, 2, 2, parse_schedule("1f1b", 2), 0, dp_overlap=True))
    assert on.dp_overlapped_s == 0 and on.dp_exposed_s > off.dp_exposed_s > 0
    alpha = synthetic().predict("allreduce", off.links["dp"], 2, 0).seconds
    assert on.dp_exposed_s - off.dp_exposed_s == pytest.approx((model.layers // 2 - 1) * alpha, rel=0.05)
    assert sum(1 for _ in space(Transformer.parse(GPT), 8)) > 100


def test_spec_calibration(tmp_path):
    cal = calibration_from_dict(load_spec("selene").to_json())
    assert cal.memory_bytes() == 80 * 2 ** 30 and cal.spec()["file"] == "selene"
    assert cal.gemm_flops_per_s("float16") == pytest.approx(312e12 * 0.859)
    assert cal.predict("allreduce", "intra", 8, 1e9).seconds == pytest.approx(14 * 1e-6 + 1.75e9 / 195e9, rel=1e-9)
    spec = json.loads((Path(__file__).parent.parent / "calib" / "selene.spec.json").read_text())
    with pytest.raises(UsageError, match="tiers\\[0\\]: key 'efficiency'"):
        from_spec({**spec, "tiers": [{**spec["tiers"][0], "efficiency": 2}]})
    with pytest.raises(UsageError, match="unknown key 'colour'"):
        from_spec({**spec, "colour": 1})
    assert cal.gemm_wave("float16") == (108, 256, 128)
    bare = {k: v for k, v in spec["device"].items() if k not in ("sms", "gemm_tile")}
    assert calibration_from_dict(from_spec({**spec, "device": bare}).to_json()).gemm_wave("float16") is None
    with pytest.raises(UsageError, match="key 'gemm_tile'"):
        from_spec({**spec, "device": {**bare, "sms": 108}})
    with pytest.raises(UsageError, match="key 'sms'"):
        from_spec({**spec, "device": {**spec["device"], "sms": 0}})


def test_an_empty_gemm_costs_its_latency_on_a_device_with_tiles(tmp_path, capsys):
    """A transformer without a vocabulary (its output projection has n = 0) on a spec's calibration, whose GEMMs fill
    tiles in waves: the empty product fills no tile and costs about the call's latency, and search prices every
    configuration (it divided by zero filled slots)."""
    cal = calibration_from_dict(load_spec("selene").to_json())
    tp = TrainingPricer(cal, Transformer.parse("transformer:d=64,heads=4,layers=2,seq=32,batch=4"), 4, 2, "float16")
    lat = cal.gemm_latency_s("float16")
    assert lat <= tp._gemms([(1, 128, 0, 64)]) < 1.01 * lat           # the latency, and its one operand's traffic
    path = tmp_path / "selene.json"
    path.write_text(json.dumps(load_spec("selene").to_json()))
    code, out, err = run_main(capsys, ["search", str(path), "--model", "transformer:d=64,heads=4,layers=2,seq=32,"
                                       "batch=4", "--devices", "4", "--gpus-per-node", "2"])
    assert code == 0 and "t1 p1 d4" in out, err


def test_wave_quantization_and_roofline_by_hand():
    """A GEMM filling 1.5 waves of tiles runs at 0.75 of the rate (the other orientation, half-filled tiles, is
    worse); one with k = 1 is priced by its bytes."""
    cal = calibration_from_dict(load_spec("selene").to_json())
    tp = TrainingPricer(cal, Transformer.parse(GPT), 8, 8, "float16")
    rate, lat = cal.gemm_flops_per_s("float16"), cal.gemm_latency_s("float16")
    full = tp._gemms([(1, 256 * 12, 128 * 9, 4096)])                 # 108 tiles: one whole wave
    half = tp._gemms([(1, 256 * 18, 128 * 9, 4096)])                 # 162 tiles: 1.5 waves
    assert full == pytest.approx(lat + 2 * 256 * 12 * 128 * 9 * 4096 / rate)
    assert half == pytest.approx(lat + 2 * 256 * 18 * 128 * 9 * 4096 / (0.75 * rate))
    thin = tp._gemms([(1, 8192, 8192, 1)])
    assert thin == pytest.approx(lat + (8192 * 8192 + 2 * 8192) * 2 / (2039e9 * 0.9))


def test_search_and_predict_cli(tmp_path, capsys):
    syn = tmp_path / "syn.json"
    syn.write_text(json.dumps(synthetic().data))
    spec = tmp_path / "selene.json"
    code, out, err = run_main(capsys, ["calibration", "from-spec", "selene", "--out", str(spec)])
    assert code == 0 and load_calibration(spec).spec() is not None
    for cal, dtype in ((syn, "float32"), (spec, None)):
        args = ["search", str(cal), "--model", GPT, "--devices", "8", "--gpus-per-node", "4", "--json", "--strict"]
        code, out, err = run_main(capsys, args + (["--dtype", dtype] if dtype else []))
        assert code == 0, err
        best = json.loads(out)["best"]
        assert best and all(b["feasible"] for b in best) and best[0]["total_s"] <= best[-1]["total_s"]
        code, out, err = run_main(capsys, ["predict", str(cal), "--model", GPT, "--devices", "8", "--gpus-per-node",
                                           "4", "--config", _config(best[0])])
        assert code == 0 and "memory per device" in out, err
    code, out, err = run_main(capsys, ["search", str(syn), "--model", "vgg13", "--mesh", "2x2"])
    assert code == 0 and "coordinate descent" in out       # the SBP search is still there
    for args, words in ((["search", str(spec), "--model", GPT, "--devices", "8"], "--mesh"),
                        (["search", str(spec), "--model", GPT, "--devices", "6", "--gpus-per-node", "4"], "fill"),
                        (["predict", str(spec), "--model", GPT, "--devices", "8", "--gpus-per-node", "4",
                          "--config", "t=3,p=1,d=1,mb=1"], "cannot run"),
                        (["predict", str(spec), "--model", GPT, "--devices", "8", "--gpus-per-node", "4",
                          "--config", "t=8,colour=1"], "colour"),
                        (["calibration", "from-spec", str(tmp_path / "none.json"), "--out", str(tmp_path / "x")],
                         "cannot read")):
        code, out, err = run_main(capsys, args)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def _config(row: dict) -> str:
    return (f"t={row['t']},p={row['p']},d={row['d']},mb={row['micro_batch']},schedule={row['schedule']},v={row['v']},"
            f"zero={row['zero']},sp={int(row['sp'])},recompute={row['recompute']},overlap={int(row['dp_overlap'])}")


@pytest.mark.parametrize("text", ["t=\u00b2,p=1,d=1,mb=1", "t=1,p=1,d=1,mb=1,schedule=interleaved/v\u00b2"])
def test_configs_refuse_digits_int_cannot_read(text):
    """A superscript is a digit to str.isdigit but no integer: one UsageError, not a ValueError."""
    with pytest.raises(UsageError):
        parse_config(text)
