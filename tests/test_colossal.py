"""Colossal-AI's tensor-parallel linear layers (analysis.colossal), without MPI: the words each schedule moves and
the flops each device computes against hand counts of the published algorithms, every collective priced by its mesh
axis's link class with the axis's concurrent groups sharing a node's link, each strategy against its SBP equivalent,
and `commcal search` listing them beside the SBP strategies (or saying why not)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from analysis import colossal
from analysis import strategies as tp
from analysis.colossal import Framed, Grid, Rooted, framed, schedule, words_moved
from analysis.layers import Compute, Linear, Strategy
from analysis.mesh import Mesh
from analysis.pricing import Pricer
from analysis.sbp import local_shape
from analysis.search import Tabulator
from calib.calibration import calibration_from_dict
from calib.synthetic import synthetic_calibration
from conftest import run_main

ISZ = 4
M, K, N = 144, 72, 108          # divisible by 9 and 4 where the grids need it, all different


def comm_ops():
    return ("allreduce", "allgather", "reduce_scatter", "alltoall", "bcast", "reduce")


def cal_dict(ops=None, links=("intra", "inter")):
    models = {(op, link): (a, b) for op in (ops or comm_ops())
              for link, a, b in (("intra", 5e-6, 1e-10), ("inter", 20e-6, 1e-9)) if link in links}
    return synthetic_calibration(models, gemm={"float32": 1e12, "float64": 5e11})


def hand_words(kind: str, q: int, d: int = 1) -> int:
    """Elements moved over all ranks, one forward and backward (dX included), from the algorithms' definitions."""
    mk, kn, mn = M * K, K * N, M * N
    return {
        # Megatron: one allreduce (2(p-1)/p of the buffer per rank, p ranks) of dX [m,k] or of Y [m,n]
        "1d-col": 2 * (q - 1) * mk, "1d-row": 2 * (q - 1) * mn,
        # SUMMA, q steps in each of three products: q groups each send a block to q - 1 others
        "2d": 3 * (q - 1) * (mk + kn),
        # d SUMMA layers (X and dX blocks are 1/d as tall, W blocks the same in each), then dW allreduced over depth
        "2.5d": 3 * (q - 1) * mk + 3 * d * (q - 1) * kn + 2 * (d - 1) * kn,
        # Agarwal: allgathers of X, W, dY and reduce-scatters of Y, dX, dW, each moving (q-1) of its whole tensor
        "3d": 2 * (q - 1) * (mk + kn + mn),
    }[kind]


CASES = [("1d-col", (4,), 4, 1), ("1d-row", (3,), 3, 1), ("2d", (2, 2), 2, 1), ("2d", (3, 3), 3, 1),
         ("2.5d", (2, 2, 2), 2, 2), ("2.5d", (3, 2, 2), 2, 3), ("3d", (2, 2, 2), 2, 1), ("3d", (3, 3, 3), 3, 1)]


@pytest.mark.parametrize("kind,shape,q,d", CASES)
def test_words_moved_and_flops_match_hand_counts(kind, shape, q, d):
    mesh = Mesh(shape, shape[-1])
    lin = Linear("l", ISZ, M, K, N)
    sc = schedule(lin, Grid(kind), mesh)
    assert sc.feasible, sc.reason
    assert words_moved(sc.steps, mesh, ISZ) == hand_words(kind, q, d)
    flops = sum(e.flops for e in sc.steps if isinstance(e, Compute))
    assert flops == pytest.approx(3 * 2 * M * K * N / mesh.devices)        # Y, dX, dW: each 1/P of the product
    no_dx = schedule(lin, Grid(kind), mesh, need_dx=False)
    assert sum(e.flops for e in no_dx.steps if isinstance(e, Compute)) == pytest.approx(2 * 2 * M * K * N / mesh.devices)
    # every rooted call moves one block of the grid: the bytes priced are its elements
    for e in sc.steps:
        if isinstance(e, Rooted):
            assert e.bytes_per_rank == np.prod(e.shape) * ISZ and e.group_size == q
    # each device holds 1/P of X and Y (1/(P/d) of W under 2.5D, replicated over depth; all of X under 1D column)
    s = colossal.sigs(Grid(kind))
    held = np.prod(local_shape((M, K), s.x, shape)) * np.prod(local_shape((M, N), s.y, shape))
    want = {"1d-col": M * K * M * N // q, "1d-row": M * K * M * N // q}.get(kind, M * K * M * N // mesh.devices ** 2)
    assert held == want


def test_summa_schedule_is_q_broadcast_pairs_then_the_two_backward_products():
    """2D, q = 2: the order of Colossal-AI's Matmul_AB / ABT / ATB: row bcast of X(i,t), column bcast of W(t,j) and a
    product per step; then W bcast, product, row reduce; then X bcast, product, column reduce."""
    sc = schedule(Linear("l", ISZ, 8, 8, 8), Grid("2d"), Mesh((2, 2), 2))
    kinds = [(e.op, e.axis, e.root) if isinstance(e, Rooted) else e.expr.split(" ")[0] for e in sc.steps]
    assert kinds == [("bcast", 1, 0), ("bcast", 0, 0), "Y", ("bcast", 1, 1), ("bcast", 0, 1), "Y",
                     ("bcast", 0, 0), "dXt", ("reduce", 1, 0), ("bcast", 0, 1), "dXt", ("reduce", 1, 1),
                     ("bcast", 1, 0), "dWt", ("reduce", 0, 0), ("bcast", 1, 1), "dWt", ("reduce", 0, 1)]
    assert len(sc.buffers) == len(sc.steps)


def test_3d_stores_weight_rows_permuted_so_the_outer_gather_is_contiguous():
    g, q, k = Grid("3d"), 2, 8
    w = np.arange(k * 3).reshape(k, 3)
    stored = colossal.stored_order(g, w, (q, q, q))
    assert (colossal.stored_order(g, stored, (q, q, q)) == w).all()       # its own inverse
    # device (i, j, l) holds stored block i*q + l = natural block l*q + i; gathering over i gives rows block l
    for l in range(q):
        got = np.concatenate([stored[(i * q + l) * 2:(i * q + l + 1) * 2] for i in range(q)])
        assert (got == w[l * 4:(l + 1) * 4]).all()
    ops = [(e.op, e.axis, e.permutes) for e in schedule(Linear("l", ISZ, 16, k, 8), g, Mesh((q, q, q), 2)).steps
           if e.is_comm]
    assert ops == [("allgather", 1, False), ("allgather", 0, True), ("reduce_scatter", 2, False),
                   ("allgather", 2, False), ("reduce_scatter", 1, False), ("reduce_scatter", 0, True)]


def test_grids_are_offered_only_on_their_meshes_and_refuse_indivisible_shapes():
    lin = Linear("l", ISZ, M, K, N)
    kinds = lambda shape: [s.id for s in colossal.strategies(lin, Mesh(shape, shape[-1]))  # noqa: E731
                           if isinstance(s, Grid)]
    assert kinds((4,)) == ["cai-1d-col", "cai-1d-row"] and kinds((2, 2)) == ["cai-2d"] and kinds((2, 4)) == []
    assert kinds((2, 2, 2)) == ["cai-2.5d", "cai-3d"] and kinds((3, 2, 2)) == ["cai-2.5d"] and kinds((2, 3, 3)) == [
        "cai-2.5d"] and kinds((1, 2, 2)) == []
    bad = schedule(Linear("l", ISZ, 6, 8, 8), Grid("3d"), Mesh((2, 2, 2), 2))
    assert not bad.feasible and "not divisible by 4" in bad.reason
    assert not schedule(lin, Grid("2d"), Mesh((2, 2, 2), 2)).feasible


def test_collectives_are_priced_by_their_axis_link_and_sharing():
    """Mesh 2x2 on 2 nodes x 2 ranks: axis 0 leaves the node (inter) and its two groups share a node's one link
    (each moves its bytes at half the bandwidth, the calibration having measured one group per node); axis 1 is
    intra. The schedule's communication price is the calibration's models at those classes, sizes doubled on
    axis 0."""
    cal = calibration_from_dict(cal_dict())
    mesh = Mesh((2, 2), 2)
    pricer = Pricer(cal, mesh)
    sc = schedule(Linear("l", ISZ, 64, 32, 48), Grid("2d"), mesh)
    want = sum(float(cal.predict_seconds(e.op, "inter" if e.axis == 0 else "intra", 2,
                                         np.array([e.size_bytes * (2 if e.axis == 0 else 1)]), after)[0])
               for e, after in zip(sc.steps, [False] + [isinstance(x, Compute) for x in sc.steps[:-1]])
               if e.is_comm)
    comm, _ = pricer.price([sc.steps])
    assert comm[0] == pytest.approx(want, rel=1e-12)
    assert {e.link for e in sc.steps if e.is_comm} == {"inter", "intra"}
    assert mesh.axes[0].groups_per_node == 2 and pricer.sharing("inter", 0) == 2
    for e in (e for e in sc.steps if e.is_comm):            # the size each step's price read (steps.csv's column)
        assert pricer.priced_bytes(e.op, e.axis, e.size_bytes) == e.size_bytes * (2 if e.axis == 0 else 1)


SBP_WORDS = {   # the SBP equivalent's plans, counted by hand (q = 2, d = 2, p = 4)
    # Megatron: the same single allreduce
    "1d-col": ("n", 2 * 3 * M * K), "1d-row": ("k", 2 * 3 * M * N),
    # m.n/ws: X allgathered once and kept, W allgathered for each phase, dX and dW reduce-scattered
    "2d": ("m.n/ws", 2 * M * K + 3 * K * N),
    # m.k.n: X allgathered and moved (alltoall), Y reduce-scattered, dY allgathered, dX moved and reduce-scattered,
    # dW allreduced over depth
    "2.5d": ("m.k.n", 4 * M * K + 2 * M * N + 2 * K * N),
    # m.n.k/ws: as cai-3d, but its weight blocks in natural order cost an alltoall on each side of the weight's
    # allgather (each phase) and of its reduce-scatter: 7.5 kn where cai-3d moves 2 kn
    "3d": ("m.n.k/ws", 2 * M * K + 2 * M * N + 15 * K * N // 2),
}


@pytest.mark.parametrize("kind,shape", [("1d-col", (4,)), ("1d-row", (4,)), ("2d", (2, 2)), ("2.5d", (2, 2, 2)),
                                        ("3d", (2, 2, 2))])
def test_each_grid_against_the_sbp_strategy_that_computes_the_same(kind, shape):
    """The fewest-words SBP strategy between a grid's placements, with the grid's flops per device: 1D is Megatron
    (the same allreduce); SUMMA broadcasts X again for dW where m.n/ws keeps it gathered, (q-1) mk more words; 2.5D
    moves more or fewer words than m.k.n as mk + 2 mn is below or above 6 kn; cai-3d moves fewer than its SBP
    equivalent by 5.5 kn."""
    mesh = Mesh(shape, shape[-1])
    lin = Linear("l", ISZ, M, K, N)
    grid = schedule(lin, Grid(kind), mesh)
    twin = framed(lin, Grid(kind), mesh)
    sbp, words = SBP_WORDS[kind]
    assert twin.strategy == Framed(Strategy(tuple(sbp.split("/")[0].split(".")), sbp.endswith("/ws")), Grid(kind))
    assert words_moved(twin.steps, mesh, ISZ) == words
    assert words_moved(grid.steps, mesh, ISZ) - words == {
        "1d-col": 0, "1d-row": 0, "2d": M * K, "2.5d": 6 * K * N - M * K - 2 * M * N, "3d": -11 * K * N // 2}[kind]
    assert tp.sigs(lin, twin.strategy) == colossal.sigs(Grid(kind))
    assert sum(e.flops for e in twin.steps if isinstance(e, Compute)) == pytest.approx(3 * 2 * M * K * N / mesh.devices)


def test_tabulator_prices_grids_beside_sbp_and_leaves_out_what_the_calibration_cannot_price():
    lin_model = "linear:m=64,k=32,n=48"
    from analysis.models import parse_model

    full = Tabulator(Pricer(calibration_from_dict(cal_dict()), Mesh((2, 2), 2)))
    opts = full.tables(parse_model(lin_model)).options[0]
    ids = [s.id for s in opts.strategies]
    assert "cai-2d" in ids and "m.n/ws" in ids and not any("@" in i for i in ids) and not full.left_out
    assert np.isfinite(opts.time_s[ids.index("cai-2d")])
    lacking = Tabulator(Pricer(calibration_from_dict(cal_dict(comm_ops()[:4])), Mesh((2, 2), 2)))
    ids = [s.id for s in lacking.tables(parse_model(lin_model)).options[0].strategies]
    assert "cai-2d" not in ids and lacking.left_out == {
        "cai-2d": "the calibration has no bcast, reduce model on any link class"}
    picked = Tabulator(Pricer(calibration_from_dict(cal_dict()), Mesh((2, 2), 2)), tp.parse_selection("cai,cai-sbp"))
    assert [s.id for s in picked.options(parse_model(lin_model).layers[0], True).strategies] == [
        "cai-2d", "m.n/ws@cai-2d"]


def test_search_lists_colossal_strategies_beside_sbp(tmp_path, capsys):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(cal_dict()))
    code, out, err = run_main(capsys, ["search", str(cal), "--model", "mlp:batch=64,d_in=64,d_hidden=128",
                                       "--mesh", "2x2x2", "--ranks-per-node", "4", "--json"])
    assert code == 0 and err == ""
    res = json.loads(out)
    linears = [r for r in res["layers"] if r["kind"] == "Linear"]
    assert linears and all({c["strategy"] for c in r["colossal"]} | {r["strategy"]} >= {"cai-2.5d", "cai-3d"}
                           for r in linears)
    assert all(c["extra_s"] >= 0 for r in linears for c in r["colossal"]) and res["left_out"] == []
    code, out, _ = run_main(capsys, ["search", str(cal), "--model", "linear:m=64,k=32,n=48", "--mesh", "2x2"])
    assert code == 0 and ("Colossal-AI: cai-2d +" in out or " cai-2d " in out)
    four = tmp_path / "four.json"
    four.write_text(json.dumps(cal_dict(comm_ops()[:4])))
    code, out, err = run_main(capsys, ["search", str(four), "--model", "linear:m=64,k=32,n=48", "--mesh", "2x2",
                                       "--strict"])
    assert code == 0 and err == ""
    assert "not priced: cai-2d (the calibration has no bcast, reduce model on any link class)" in out


def test_predict_prints_a_grid_strategy_step_by_step(tmp_path, capsys):
    """`commcal predict --layer --strategy cai-2d --mesh 2x2`: each broadcast and reduction with its root, priced
    by the calibration (the layer is a model's first, so no dX products: 2 steps of 2 broadcasts, then 2 of a
    broadcast and a reduction)."""
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(cal_dict()))
    code, out, err = run_main(capsys, ["predict", str(cal), "--layer", "linear:m=64,k=32,n=48", "--strategy",
                                       "cai-2d", "--mesh", "2x2", "--json"])
    assert code == 0 and err == ""
    steps = [s for s in json.loads(out)["steps"] if s["where"] == "linear forward" or s["where"] == "linear backward"]
    calls = [(s["op"], s["axis"], s["root"], s["link"]) for s in steps if s["kind"] == "comm"]
    assert calls == [("bcast", 1, 0, "intra"), ("bcast", 0, 0, "inter"), ("bcast", 1, 1, "intra"),
                     ("bcast", 0, 1, "inter"), ("bcast", 1, 0, "intra"), ("reduce", 0, 0, "inter"),
                     ("bcast", 1, 1, "intra"), ("reduce", 0, 1, "inter")]
    assert all(s["seconds"] > 0 for s in steps)
    code, out, _ = run_main(capsys, ["predict", str(cal), "--layer", "linear:m=64,k=32,n=48", "--strategy",
                                     "cai-2d", "--mesh", "2x2"])
    assert code == 0 and "bcast axis 0 (inter, 2 ranks) W(1,j) from member 1 1536 B/rank" in out
