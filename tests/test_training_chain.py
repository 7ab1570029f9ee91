"""The training step of a chain model (analysis.training_chain): a data-parallel step by hand, the pipeline cut
against every other cut, tensor groups that split the work, memory by ZeRO stage, the options only a transformer
has refused with their reason, and the search and predict front doors on a synthetic and a spec calibration."""

from __future__ import annotations

import json

import pytest

from analysis.pricing import Pricer
from analysis.schedules import Schedule
from analysis.training import Config, parse_config
from analysis.training_chain import Chain, ChainTrainingPricer
from conftest import run_main
from test_training import _config, synthetic

MLP = "mlp:batch=64,d_in=256,d_hidden=512"
STACK = "dense:batch=16,dims=64-4096-64-64-64"


def pricer(spec: str, devices: int, per_node: int, backend: str = "mpi", **kw) -> ChainTrainingPricer:
    return ChainTrainingPricer(synthetic(backend), Chain.parse(spec, "float32"), devices, per_node, "float32", **kw)


def test_a_data_parallel_step_by_hand():
    """d = 2, one micro-batch of 32 rows each: every linear's three GEMMs (forward, input and weight gradients; the
    first layer's input gradient is not needed) at the GEMM model, and the fp16 gradients all-reduced on the
    node's link."""
    tp = pricer(MLP, 2, 2)
    step = tp.price(Config(1, 1, 2, 32))
    cal = tp.cal
    rate, lat = cal.gemm_flops_per_s("float32"), cal.gemm_latency_s("float32")
    gemms = [(32, 256, 512)] * 2 + [(32, 512, 256)] * 3           # fc1 forward and dW; fc2's three
    relu = Pricer(cal, tp.group(1).mesh, "float32").traffic_seconds
    expected = sum(lat + 2 * a * b * c / rate for a, b, c in gemms) + relu(2 * 32 * 512) * 2
    assert step.micro_batches == 1 and step.feasible
    assert step.compute_s == pytest.approx(expected, rel=1e-6)
    params = 2 * 256 * 512
    assert tp.model.params == params and step.memory.params == pytest.approx(2 * params)
    assert step.dp_exposed_s == pytest.approx(cal.predict("allreduce", "intra", 2, 2 * params).seconds, rel=1e-6)
    assert step.tp_comm_s == step.pp_comm_s == step.bubble_s == 0
    assert step.total_s == pytest.approx(sum(getattr(step, k) for k in step.PARTS))


def test_the_pipeline_cut_is_the_best_of_every_cut_and_prices_its_messages():
    tp = pricer(STACK, 2, 1)
    c = Config(1, 2, 1, 4, Schedule("1f1b"))
    cut = tp.cut(c)
    costs = tp.layer_costs(1, 4)
    times = [x.times.total for x in costs]
    assert [i for dev in cut.devices for ch in dev for i in ch] == list(range(len(costs)))
    best = min(max(sum(times[:k]), sum(times[k:])) for k in range(1, len(times)))
    assert cut.times.slowest == pytest.approx(best)
    step = tp.price(c)
    boundary = costs[cut.devices[0][0][-1]].out_bytes
    one = tp.cal.predict("pingpong", "inter", 2, boundary).seconds
    assert step.pp_comm_s == pytest.approx(Schedule("1f1b").messages(2, 4) * one, rel=1e-6)
    assert step.bubble_s == pytest.approx(sum(times) / 2)           # one slot of the mean stage
    assert step.total_s == pytest.approx(4 * cut.times.slowest + step.bubble_s + step.pp_comm_s)
    two = pricer(STACK, 4, 2).cut(Config(2, 2, 1, 4))            # a tensor group of 2: each sends half the boundary
    assert two.times.message_bytes == pricer(STACK, 4, 2).layer_costs(2, 4)[two.devices[0][0][-1]].out_bytes / 2
    inter = tp.cut(Config(1, 2, 1, 4, Schedule("interleaved", 2)))
    assert [len(dev) for dev in inter.devices] == [2, 2] and inter.devices[0][1][0] > inter.devices[1][0][-1]


def test_a_tensor_group_splits_the_work_where_its_links_are_fast():
    """On one node's fast links the best strategies of a group of 4 split the GEMMs: a quarter of the compute and
    some communication, faster than one device; the same group over 4 single-device nodes' slower links costs more."""
    big = "mlp:batch=256,d_in=4096,d_hidden=16384"
    one = pricer(big, 1, 1).price(Config(1, 1, 1, 256))
    four = pricer(big, 4, 4).price(Config(4, 1, 1, 256))
    assert four.compute_s == pytest.approx(one.compute_s / 4, rel=0.05) and four.tp_comm_s > 0
    assert four.links == {"tp": "intra"} and four.total_s < one.total_s
    spread = pricer(big, 4, 1).price(Config(4, 1, 1, 256))
    assert spread.links == {"tp": "inter"} and spread.total_s > four.total_s


def test_memory_by_zero_stage_and_recomputation():
    tp = pricer(MLP, 4, 4)
    P = 2 * 256 * 512
    for zero, (pw, gw, ow) in {0: (1, 1, 1), 1: (1, 1, 4), 2: (1, 4, 4), 3: (4, 4, 4)}.items():
        mem = tp.memory(Config(1, 1, 4, 4, zero=zero), 4)
        assert (mem.params, mem.grads, mem.optimizer) == pytest.approx((2 * P / pw, 2 * P / gw, 12 * P / ow))
    kept = tp.memory(Config(1, 1, 4, 4), 4).activations
    assert kept == pytest.approx(4 * 4 * (256 + 512 + 512))          # fc1, relu, fc2 inputs of one micro-batch
    full = tp.memory(Config(1, 1, 4, 4, recompute="full"), 4).activations
    assert full == pytest.approx(4 * 4 * 256 + kept)                 # the stage input, and one recomputed chunk
    gpipe = tp.memory(Config(1, 2, 2, 4, Schedule("gpipe")), 4)
    assert gpipe.activations > tp.memory(Config(1, 2, 2, 4, Schedule("1f1b")), 4).activations


def test_options_only_a_transformer_has_are_refused_with_their_reason():
    tp = pricer(STACK.replace("batch=16", "batch=24"), 12, 4)
    for text, words in {"t=3,p=1,d=4,mb=1": "neither divides", "t=2,p=1,d=6,mb=1,sp=1": "sequence parallelism",
                        "t=4,p=1,d=3,mb=1,recompute=selective": "attention core",
                        "t=1,p=4,d=3,mb=1,schedule=interleaved,v=2": "do not make 8",
                        "t=1,p=2,d=6,mb=3": "does not split", "t=4,p=3,d=1,mb=1,zero=1": "needs d > 1"}.items():
        step = tp.price(parse_config(text))
        assert not step.feasible and words in step.reason, (text, step.reason)
    configs = list(tp.space())
    assert configs and all(tp.problem(c) is None for c in configs)
    assert {c.p for c in configs} == {1, 2, 3, 4, 6} and not any(c.sp or c.recompute == "selective" for c in configs)
    with pytest.raises(Exception, match="not a chain"):
        Chain.parse("gpt-1.2b", "float32")


def test_search_and_predict_cli_on_chains(tmp_path, capsys):
    syn = tmp_path / "syn.json"
    syn.write_text(json.dumps(synthetic().data))
    spec = tmp_path / "selene.json"
    assert run_main(capsys, ["calibration", "from-spec", "selene", "--out", str(spec)])[0] == 0
    for cal, model in ((syn, "vgg13"), (spec, "vgg13"), (syn, "vgg-small"), (spec, "mlp:batch=512")):
        code, out, err = run_main(capsys, ["search", str(cal), "--model", model, "--devices", "8", "--gpus-per-node",
                                           "4", "--json", "--strict"])
        assert code == 0, err
        found = json.loads(out)
        best = found["best"]
        assert best and all(b["feasible"] for b in best) and best[0]["total_s"] <= best[-1]["total_s"]
        assert found["evaluated"] > 100
        code, out, err = run_main(capsys, ["predict", str(cal), "--model", model, "--devices", "8",
                                           "--gpus-per-node", "4", "--config", _config(best[0]), "--json"])
        again = json.loads(out)
        assert code == 0 and again["total_s"] == pytest.approx(best[0]["total_s"]), err
    code, out, err = run_main(capsys, ["search", str(spec), "--model", "vgg13", "--devices", "8", "--gpus-per-node",
                                       "4"])
    assert code == 0 and "searched" in out and "vgg13" in out, err
    for args, words in ((["--config", "t=2,p=1,d=4,mb=1,sp=1"], "sequence parallelism"),
                        (["--config", "t=2,p=4,d=1,mb=1,schedule=interleaved,v=2"], "do not make 8")):
        code, out, err = run_main(capsys, ["predict", str(spec), "--model", "vgg13", "--devices", "8",
                                           "--gpus-per-node", "4", *args])
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_cuts_cover_the_chain_in_order_for_every_p():
    tp = pricer(STACK, 8, 8)
    n = Chain.parse(STACK, "float32").layers
    for p in (1, 2, 4):
        for v in (1, 2):
            if p * v > n or (v > 1 and p == 1):
                continue
            cut = tp.cut(Config(1, p, 8 // p, 1, Schedule("interleaved", v) if v > 1 else Schedule("1f1b")))
            chunks = sorted((ch for dev in cut.devices for ch in dev), key=lambda ch: ch[0])
            assert [i for ch in chunks for i in ch] == list(range(n)) and all(chunks)
            assert all(list(dev) == chunks[r::p] for r, dev in enumerate(cut.devices))   # chunk k on device k mod p
