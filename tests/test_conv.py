"""Convolutional layers and ParaDL's strategies, without MPI: the conv kernels against a direct sum and finite
differences, spatial blocks with halos against the whole convolution, each strategy's priced communication against
ParaDL's formulas (halo rows as sendrecv, weight gradients allreduced, outputs gathered, partial sums reduced),
link sharing of concurrent halo groups, the network strategies and the pipeline stage model."""

import json
import math
from functools import partial

import numpy as np
import pytest

from analysis import conv_kernels as K
from analysis.conv import BatchNorm2d, Conv2d, Pool2d
from analysis.layers import Strategy
from analysis.mesh import Mesh, parse_mesh
from analysis.models import parse_model
from analysis.paradl import STRATEGIES, applicable, assignment, network_options, pipeline
from analysis.pricing import Pricer
from analysis.redistribute import plan as redistribution
from analysis.sbp import B, P
from analysis.schedules import Schedule
from analysis.search import Tabulator
from calib.algorithms import CANDIDATES, algorithm
from calib.calibration import load_calibration
from calib.synthetic import synthetic_calibration
from microbench.errors import UsageError

OPS = ("allreduce", "allgather", "reduce_scatter", "alltoall", "sendrecv", "pingpong")
ALPHA, BETA = 5e-6, 1e-9


@pytest.fixture
def cal(tmp_path):
    models = {(op, link): (ALPHA, BETA) for op in OPS for link in ("intra", "inter")}
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(synthetic_calibration(models, links={"intra": [2, 4], "inter": [2, 4]},
                                                     gemm={"float32": 1e10, "float64": 5e9})))
    return load_calibration(path)


def _direct(x, w):
    k = w.shape[2]
    h = (k - 1) // 2
    pad = np.pad(x, ((0, 0), (0, 0), (h, h), (h, h)))
    return sum(np.einsum("fc,nchw->nfhw", w[:, :, i, j], pad[:, :, i:i + x.shape[2], j:j + x.shape[3]])
               for i in range(k) for j in range(k))


def _run(k, e):
    """A convolution's kernels forward and backward, in a schedule's order."""
    for kernel in (K.conv_columns, K.conv_product, K.conv_column_grad, K.conv_input_grad, K.conv_weight_grad):
        kernel(k, np, e) if kernel in (K.conv_columns, K.conv_input_grad) else kernel(np, e)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_conv_kernels_match_a_direct_sum_and_finite_differences(k):
    rng = np.random.default_rng(k)
    x, w, dy = rng.standard_normal((2, 3, 7, 6)), rng.standard_normal((4, 3, k, k)), rng.standard_normal((2, 4, 7, 6))
    e = {"X": x, "W": w, "dY": dy}
    _run(k, e)
    np.testing.assert_allclose(e["Y"], _direct(x, w), atol=1e-12)
    loss = lambda x_, w_: float((_direct(x_, w_) * dy).sum())  # noqa: E731 - linear, so central differences are exact
    for idx in [(0, 0, 0, 0), (1, 2, 6, 5), (1, 1, 3, 2)]:
        d = np.zeros_like(x)
        d[idx] = 1.0
        assert e["dX"][idx] == pytest.approx((loss(x + d, w) - loss(x - d, w)) / 2, rel=1e-9, abs=1e-9)
    for idx in [(0, 0, 0, 0), (3, 2, k - 1, k // 2)]:
        d = np.zeros_like(w)
        d[idx] = 1.0
        assert e["dW"][idx] == pytest.approx((loss(x, w + d) - loss(x, w - d)) / 2, rel=1e-9, abs=1e-9)


def test_spatial_blocks_with_halos_make_the_whole_convolution():
    """Three blocks of rows, each given its neighbours' boundary rows (zeros at the ends): their outputs stack into
    the whole output, their weight gradients sum to the whole one, and the halo rows' gradients, added into their
    owners' rows, complete the input gradient."""
    rng = np.random.default_rng(0)
    k, h = 5, 2
    x, w, dy = rng.standard_normal((2, 3, 9, 4)), rng.standard_normal((2, 3, k, k)), rng.standard_normal((2, 2, 9, 4))
    whole = {"X": x, "W": w, "dY": dy}
    _run(k, whole)
    zeros = np.zeros((2, 3, h, 4))
    blocks = []
    for b in range(3):
        rows = slice(3 * b, 3 * b + 3)
        e = {"X": x[:, :, rows], "W": w, "dY": dy[:, :, rows],
             "Xtop": x[:, :, 3 * b - h:3 * b] if b else zeros,
             "Xbot": x[:, :, 3 * b + 3:3 * b + 3 + h] if b < 2 else zeros}
        _run(k, e)
        blocks.append(e)
    np.testing.assert_allclose(np.concatenate([e["Y"] for e in blocks], axis=2), whole["Y"], atol=1e-12)
    np.testing.assert_allclose(sum(e["dW"] for e in blocks), whole["dW"], atol=1e-12)
    dx = np.concatenate([e["dX"] for e in blocks], axis=2)
    for b, e in enumerate(blocks):
        if b:
            dx[:, :, 3 * b - h:3 * b] += e["dXtop"]
        if b < 2:
            dx[:, :, 3 * b + 3:3 * b + 3 + h] += e["dXbot"]
    np.testing.assert_allclose(dx, whole["dX"], atol=1e-12)


def test_pooling_routes_each_gradient_to_its_window_maximum():
    rng = np.random.default_rng(1)
    x, dy = rng.standard_normal((2, 3, 4, 6)), rng.standard_normal((2, 3, 2, 3))
    e = {"X": x, "dY": dy}
    K.pool_forward(np, e)
    K.pool_grad(np, e)
    assert e["Y"][1, 2, 1, 2] == x[1, 2, 2:4, 4:6].max()
    assert (e["dX"] != 0).sum() == dy.size and e["dX"].sum() == pytest.approx(dy.sum())
    assert e["dX"][1, 2, 2:4, 4:6].max() == pytest.approx(max(dy[1, 2, 1, 2], 0)) or dy[1, 2, 1, 2] < 0


def test_batch_norm_kernels_match_finite_differences_and_split_sums():
    """The forward normalises each channel; dX and [dgamma, dbeta] match central differences of sum(Y * dY); and the
    per-channel sums of two halves of the batch add up to the whole's (what the allreduce relies on)."""
    rng = np.random.default_rng(3)
    x, w, dy = rng.standard_normal((4, 3, 5, 2)), rng.standard_normal((2, 3)), rng.standard_normal((4, 3, 5, 2))

    def run(x_, w_):
        e = {"X": x_, "W": w_, "dY": dy}
        for kernel in (K.bn_stats, partial(K.bn_forward, 40, 1e-5), K.bn_grad_stats, partial(K.bn_grad, 40)):
            kernel(np, e)
        return e
    e = run(x, w)
    xhat = (e["Y"] - w[1][None, :, None, None]) / w[0][None, :, None, None]
    np.testing.assert_allclose(xhat.mean(axis=(0, 2, 3)), 0, atol=1e-12)
    np.testing.assert_allclose(xhat.var(axis=(0, 2, 3)), 1, rtol=1e-3)
    loss = lambda x_, w_: float((run(x_, w_)["Y"] * dy).sum())  # noqa: E731
    for idx in [(0, 0, 0, 0), (3, 2, 4, 1)]:
        d = np.zeros_like(x)
        d[idx] = 1e-6
        assert e["dX"][idx] == pytest.approx((loss(x + d, w) - loss(x - d, w)) / 2e-6, rel=1e-5, abs=1e-7)
    for idx in [(0, 1), (1, 2)]:
        d = np.zeros_like(w)
        d[idx] = 1e-6
        assert e["dW"][idx] == pytest.approx((loss(x, w + d) - loss(x, w - d)) / 2e-6, rel=1e-5, abs=1e-7)
    halves = [{"X": x[:2]}, {"X": x[2:]}]
    for h in halves:
        K.bn_stats(np, h)
    np.testing.assert_allclose(halves[0]["S"] + halves[1]["S"], e["S"], atol=1e-12)


def test_batch_norm_allreduces_its_channel_sums_where_the_batch_or_height_is_split():
    bn = BatchNorm2d("bn", 4, batch=8, channels=16, height=16, width=16)
    for choice in ("n", "s"):
        assert _comm(bn.schedule(Strategy((choice,)), parse_mesh("4"))) == [("allreduce", 0, 2 * 16 * 4)] * 2
    mesh = parse_mesh("2x2")
    both = redistribution((2, 16), 4, (P, P), (B, B), mesh).steps        # partial on both axes: the plan's route
    assert _comm(bn.schedule(Strategy(("n", "s")), mesh)) == [(st.op, st.axis, st.size_bytes) for st in both] * 2
    assert _comm(bn.schedule(Strategy(("n", "c")), mesh)) == [("allreduce", 0, 2 * 8 * 4)] * 2
    assert _comm(bn.schedule(Strategy(("c", "-")), mesh)) == []


CONV = Conv2d("c", 4, batch=8, channels=16, filters=32, height=16, width=16, kernel=3)


def _comm(sched):
    return [(st.op, st.axis, st.size_bytes) for st in sched.steps if not hasattr(st, "flops") and st.is_comm]


def test_each_strategy_prices_paradls_communication(cal):
    """On 4 ranks: data and spatial allreduce the weight gradient (F*C*k*k floats); spatial adds four halo
    sendrecvs of one row (batch x channels x width), two forward and two backward; filter and channel leave their
    exchanges to the plans between layers."""
    mesh = parse_mesh("4")
    grad_bytes = 32 * 16 * 9 * 4
    assert _comm(CONV.schedule(Strategy(("n",)), mesh)) == [("allreduce", 0, grad_bytes)]
    halo = 8 * 16 * 1 * 16 * 4
    assert _comm(CONV.schedule(Strategy(("s",)), mesh)) == [("sendrecv", 0, halo)] * 4 + [("allreduce", 0, grad_bytes)]
    assert _comm(CONV.schedule(Strategy(("f",)), mesh)) == [] == _comm(CONV.schedule(Strategy(("c",)), mesh))
    pricer = Pricer(cal, mesh)
    sched = CONV.schedule(Strategy(("s",)), mesh)
    comm, _ = pricer.price([sched.steps])
    halo_s = ALPHA + BETA * halo       # the synthetic sendrecv model
    a, b = algorithm(CANDIDATES["allreduce"][0]).coefficients(4)     # the synthetic allreduce at p = 4
    want = 4 * halo_s + a * ALPHA + b * BETA * grad_bytes
    copies = sum(pricer.copies_seconds(st) for st in sched.steps if not hasattr(st, "flops") and st.is_comm)
    assert comm[0] == pytest.approx(want + copies, rel=1e-6)


def test_halo_groups_sharing_a_nodes_link_pay_its_bandwidth_share(cal):
    """Mesh 2x2 over 2 nodes with spatial on axis 0 (across nodes): both groups of the axis cross the same node
    links, so each halo's bytes cost twice (one nic, a calibration of one group at a time); within a node, once."""
    mesh = Mesh((2, 2), 2)
    across = CONV.schedule(Strategy(("s", "n")), mesh)
    halo = next(st for st in across.steps if getattr(st, "op", "") == "sendrecv")
    pricer = Pricer(cal, mesh)
    assert halo.link == "inter" and pricer.sharing("inter", 0) == 2
    assert pricer.step_seconds(halo) == pytest.approx(ALPHA + BETA * 2 * halo.size_bytes
                                                      + pricer.copies_seconds(halo), rel=1e-6)
    within = CONV.schedule(Strategy(("n", "s")), mesh)
    halo = next(st for st in within.steps if getattr(st, "op", "") == "sendrecv")
    assert halo.link == "intra" and pricer.step_seconds(halo) == pytest.approx(
        ALPHA + BETA * halo.size_bytes + pricer.copies_seconds(halo), rel=1e-6)


def test_infeasible_spatial_splits_say_why():
    mesh = parse_mesh("4")
    thin = Conv2d("t", 4, batch=2, channels=2, filters=2, height=4, width=4, kernel=5)
    assert "thinner than the 2-row halo" in thin.schedule(Strategy(("s",)), mesh).reason
    assert "more than one mesh axis" in CONV.schedule(Strategy(("s", "s")), parse_mesh("2x2")).reason
    assert all(s.choices.count("s") <= 1 for s in CONV.strategies(parse_mesh("2x2")))
    assert "cannot be pooled" in Pool2d("p", 4, 2, 2, 4, 4).schedule(Strategy(("s",)), mesh).reason


def test_network_strategies_assign_paradls_choices_and_price_their_exchanges(cal):
    model = parse_model("vgg-small")
    mesh = parse_mesh("4")
    assert applicable(mesh) == ["data", "filter", "channel", "spatial"]
    assert applicable(parse_mesh("2x2")) == ["data", "filter", "channel", "data+filter", "data+spatial"]
    assert [s.id for s in assignment(model, "filter", mesh)][:5] == ["f", "c", "f", "c", "c"]
    assert [s.id for s in assignment(model, "data+spatial", parse_mesh("2x2"))][:3] == ["n.s", "n.s", "n.s"]
    with pytest.raises(UsageError, match="needs a 2-d mesh"):
        assignment(model, "data+filter", mesh)
    opts = network_options(model, list(STRATEGIES)[:4], Tabulator(Pricer(cal, mesh)))
    ops = {s.id: {st.op for st in opts.steps(i) if not hasattr(st, "flops") and st.is_comm}
           for i, s in enumerate(opts.strategies)}
    assert ops["data"] == {"allreduce"}
    assert {"allgather", "reduce_scatter"} <= ops["filter"] and "sendrecv" not in ops["filter"]
    assert "reduce_scatter" in ops["channel"]
    assert {"sendrecv", "allreduce", "alltoall"} <= ops["spatial"]         # the dense head goes batch-parallel
    assert (opts.time_s > opts.compute_s).all() and np.isfinite(opts.time_s).all()


def test_pipeline_balances_stages_and_adds_bubble_and_messages(cal):
    mesh = parse_mesh("4")
    pipe = pipeline("vgg-small", cal, mesh, 4, Schedule("gpipe"))
    assert sum(pipe.stages) == 14 and len(pipe.stages) == 4
    # one micro-batch's boundary activation (2 x 16 x 32 x 32 floats at most) as a pingpong, 2 (m + p - 1) times
    assert pipe.messages_s == pytest.approx(2 * (4 + 3) * (ALPHA + BETA * 2 * 16 * 32 * 32 * 4), rel=0.5)
    assert pipe.total_s == pytest.approx(4 * pipe.slowest_s + pipe.bubble_s + pipe.messages_s)
    one = pipeline("vgg-small", cal, parse_mesh("1"), 4, Schedule("gpipe"))
    assert one.messages_s == 0 and one.bubble_s == 0 and pipe.slowest_s < one.slowest_s
    with pytest.raises(UsageError, match="micro-batches"):
        pipeline("vgg-small", cal, mesh, 3, Schedule("gpipe"))


def test_cnn_specs_build_the_presets_and_refuse_bad_input():
    model = parse_model("resnet-small")
    assert [type(l).__name__ for l in model.layers[:3]] == ["Conv2d", "Activation2d", "Conv2d"]
    assert model.layers[-1].out_shape == (8, 16) and model.layers[0].in_shape == (8, 4, 32, 32)
    assert math.prod(parse_model("cnn:image=8,convs=4-p").layers[-2].out_shape[1:]) == 4 * 4 * 4
    for spec, says in [("cnn:convs=4-x", "sizes joined by"), ("cnn:image=6,convs=4-p-p", "cannot be pooled"),
                       ("cnn:kernel=2", "must be odd")]:
        with pytest.raises(UsageError, match=says):
            parse_model(spec)


def test_cnn_stack_backward_is_the_gradient_of_its_forward_and_its_boundaries_change_shape():
    """The pipeline's CNN stack (each layer by its replicated schedule's kernels): every weight gradient of the
    one-process reference matches finite differences of the loss <output, R>; the activation entering each layer
    (and leaving the last) has the layer's shape at any row count; batch norm is refused."""
    from analysis.harness_cnn import CnnStack
    from analysis.harness_pipeline import reference

    stack = CnnStack(parse_model("cnn:batch=2,image=4,channels=2,convs=3-p,dense=4-3", "float64"))
    data = stack.data(5)
    y, grads = reference(stack, data)
    assert y.shape == stack.shape(stack.layers, 2) == (2, 3)
    assert [stack.shape(i, 1) for i in (0, 3, 4, 5)] == [(1, 2, 4, 4), (1, 3, 2, 2), (1, 12), (1, 4)]
    loss = lambda: float((reference(stack, data)[0] * data["R"]).sum())  # noqa: E731
    weighted = [i for i, w in enumerate(data["weights"]) if w]
    assert len(weighted) == 3
    for i in weighted:
        w = data["weights"][i]["W"]
        for idx in [tuple(0 for _ in w.shape), tuple(s - 1 for s in w.shape)]:
            w[idx] += 1e-6
            up = loss()
            w[idx] -= 2e-6
            down = loss()
            w[idx] += 1e-6
            assert (up - down) / 2e-6 == pytest.approx(grads[i]["W"][idx], rel=1e-5, abs=1e-8), (i, idx)
    with pytest.raises(UsageError, match="batch norm"):
        CnnStack(parse_model("cnn:batch=2,image=4,channels=2,convs=3,dense=4,bn=1"))
