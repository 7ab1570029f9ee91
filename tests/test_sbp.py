"""SBP algebra and redistribution plans: textbook collectives, symbolic execution, pricing monotonicity."""

from __future__ import annotations

import itertools
import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.layers import Elementwise, Embedding, Linear, Strategy
from analysis.mesh import Mesh, parse_mesh
from analysis.redistribute import Step, adjoint, plan
from analysis.sbp import B, P, S, Placement, Signature, Split, fmt, local_slices
from analysis.search import resolved
from microbench.errors import UsageError

ISZ = 4


def parse_signature(text: str) -> Signature:
    """"S(0),B" or "[S(0), B]" -> (S(0), B)."""
    out = []
    for tok in re.split(r"\s*,\s*(?![^()]*\))", text.strip().strip("[]").strip()):
        m = re.fullmatch(r"S\((\d+)\)|([BP])", tok.strip())
        if not m:
            raise UsageError(f"bad placement {tok!r} in signature {text!r}; use S(d), B or P")
        out.append(Split(int(m.group(1))) if m.group(1) is not None else Placement(m.group(2)))
    return tuple(out)


def apply_step(sig: Signature, step: Step) -> Signature:
    """The signature after `step`: what its op does to the axis placement (symbolic execution)."""
    a = sig[step.axis]
    legal = {"allreduce": a == P, "reduce_scatter": a == P, "allgather": a.is_split, "alltoall": a.is_split,
             "slice": a == B, "partial": a != P, "relabel": step.group_size == 1}
    if not legal[step.op]:
        raise ValueError(f"{step.op} cannot act on {a} (axis {step.axis} of {fmt(sig)})")
    out = {"allreduce": B, "allgather": B, "partial": P, "relabel": step.dst[step.axis]}.get(step.op) \
        or Split(step.scatter_dim)
    return sig[:step.axis] + (out,) + sig[step.axis + 1:]


@pytest.fixture(scope="module")
def pricer22():
    from calib.calibration import calibration_from_dict
    from calib.synthetic import synthetic_calibration

    from analysis.pricing import Pricer
    models = {(op, link): (a, 1 / bw) for op in ("allreduce", "allgather", "reduce_scatter", "alltoall")
              for link, a, bw in (("intra", 5e-6, 100e9), ("inter", 20e-6, 12e9))}
    return Pricer(calibration_from_dict(synthetic_calibration(models, gemm={"float32": 1e13})), Mesh((2, 2), 2))


def comm(steps):
    return [(s.op, s.axis, s.bytes_per_rank) for s in steps if s.is_comm]


def test_placements_are_values():
    assert S(0) == S(0) and S(0) != S(1) and B != P and hash(S(1)) == hash(S(1))
    assert parse_signature("[S(1), B, P]") == (S(1), B, P)
    with pytest.raises(UsageError):
        parse_signature("S(x),B")


def test_mesh_link_classes():
    m = parse_mesh("2x4")
    assert [a.link for a in m.axes] == ["inter", "intra"]
    m3 = parse_mesh("2x2x2", ranks_per_node=4)
    assert [(a.nodes, a.ranks_per_node, a.link) for a in m3.axes] == [(2, 1, "inter"), (1, 2, "intra"), (1, 2, "intra")]
    assert parse_mesh("4x4", ranks_per_node=2).axes[1].link == "spread"
    with pytest.raises(UsageError):
        parse_mesh("2x4", devices=6)
    with pytest.raises(UsageError):
        parse_mesh("2x3", ranks_per_node=4)


def test_data_parallel_matmul_one_gradient_allreduce_of_w():
    mesh = Mesh((4,), 4)
    lin = Linear("l", ISZ, 64, 32, 16)
    sched = lin.schedule(Strategy(("m",)), mesh)
    assert comm(sched.forward) == []
    assert comm(sched.backward) == [("allreduce", 0, 32 * 16 * ISZ)]


def test_megatron_column_then_row_one_allreduce_per_forward():
    mesh = Mesh((4,), 4)
    col, act, row = Linear("a", ISZ, 64, 32, 128), Elementwise("g", ISZ, 64, 128), Linear("b", ISZ, 64, 128, 32)
    sc, sa, sr = Strategy(("n",)), Strategy(("c",)), Strategy(("k",))
    fwd = (col.schedule(sc, mesh, False).forward + plan(col.out_shape, ISZ, col.sigs(sc).y, act.sigs(sa).x, mesh).steps
           + act.schedule(sa, mesh).forward + plan(act.out_shape, ISZ, act.sigs(sa).y, row.sigs(sr).x, mesh).steps
           + row.schedule(sr, mesh).forward
           + plan(row.out_shape, ISZ, row.sigs(sr).y, resolved(row.sigs(sr).y), mesh).steps)
    assert comm(fwd) == [("allreduce", 0, 64 * 32 * ISZ)]
    # backward of the row layer needs no communication; the column layer's dX is a partial sum
    assert comm(row.schedule(sr, mesh).backward) == [] and col.sigs(sc).dx == (P,)


def held_indices(p, dim: int, mesh: Mesh, start=None) -> dict:
    """Which global indices of `dim` each device holds, in local order, after the plan's steps: a symbolic run
    of the documented step semantics over every mesh coordinate (no data, no MPI)."""
    coords = list(itertools.product(*(range(n) for n in mesh.shape)))
    held = start or {c: list(range(p.shape[dim]))[local_slices(p.shape, p.src, mesh.shape, c)[dim]] for c in coords}
    for st in p.steps:
        group = lambda c: [c[:st.axis] + (q,) + c[st.axis + 1:] for q in range(mesh.shape[st.axis])]  # noqa: E731
        chunk = lambda lst, c: lst[c[st.axis] * len(lst) // st.group_size:(c[st.axis] + 1) * len(lst) // st.group_size]  # noqa: E731
        if st.op in ("reduce_scatter", "slice") and st.scatter_dim == dim:
            held = {c: chunk(held[c], c) for c in coords}
        elif st.op in ("allgather", "partial") and st.gather_dim == dim:   # S->P: zeros at the others' blocks
            held = {c: [i for m in group(c) for i in held[m]] for c in coords}
        elif st.op == "alltoall" and dim in (st.gather_dim, st.scatter_dim):
            held = {c: [i for m in group(c) for i in held[m]] if st.gather_dim == dim else chunk(held[c], c)
                    for c in coords}
    return held


def index_order(p, dim: int, mesh: Mesh, held: dict) -> list[int]:
    """The global order of `dim` in which every device holds the canonical block of p.dst; fails unless the
    devices agree on one bijection."""
    order = [None] * p.shape[dim]
    for c, lst in held.items():
        block = range(p.shape[dim])[local_slices(p.shape, p.dst, mesh.shape, c)[dim]]
        assert len(block) == len(lst)
        for pos, i in zip(block, lst):
            assert order[pos] in (None, i), f"devices disagree on position {pos} of dim {dim}"
            order[pos] = i
    assert sorted(order) == list(range(p.shape[dim])), "not a permutation"
    return order


def test_autoddl_3d_reduce_scatter_then_allgather():
    """Consecutive 3D layers: y = [S(0), S(1), P] (rows, columns, partial over the reduction axis) becomes
    the next layer's x = [S(0), B, S(1)] by a reduce-scatter and an allgather, with the columns permuted
    (the next layer stores its weight rows in that order); its dX comes back by the adjoint, which restores
    the order. Without the permutation the fixed block layout needs an extra all-to-all."""
    mesh = Mesh((2, 2, 2), 2)
    y, x_next = (S(0), S(1), P), (S(0), B, S(1))
    whole = 64 * 64 * ISZ
    p = plan((64, 64), ISZ, y, x_next, mesh, frozenset({1}))
    assert comm(p.steps) == [("reduce_scatter", 2, whole // 4), ("allgather", 1, whole // 8)]
    assert p.permuted == (1,)
    order = index_order(p, 1, mesh, held_indices(p, 1, mesh))
    assert order != list(range(64))
    back = adjoint(p, mesh)
    assert (back.src, back.dst) == ((S(0), P, S(1)), (S(0), S(1), B))
    assert comm(back.steps) == [("reduce_scatter", 1, whole // 4), ("allgather", 2, whole // 8)]
    start = {c: [order[i] for i in lst] for c, lst in held_indices(plan((64, 64), ISZ, back.src, back.src, mesh),
                                                                    1, mesh).items()}
    assert index_order(back, 1, mesh, held_indices(back, 1, mesh, start)) == list(range(64))
    plain = plan((64, 64), ISZ, y, x_next, mesh)
    assert [o for o, _, _ in comm(plain.steps)] == ["reduce_scatter", "allgather", "alltoall"] and not plain.permuted
    assert index_order(plain, 1, mesh, held_indices(plain, 1, mesh)) == list(range(64))


def test_colossal_ai_1d_and_2d_forward_volumes():
    q, m, k, n = 2, 64, 32, 48
    # 1D (Megatron row layer): one allreduce of the whole output per forward
    one = Mesh((4,), 4)
    row = Linear("r", ISZ, m, k, n)
    y = row.sigs(Strategy(("k",))).y
    assert comm(plan(row.out_shape, ISZ, y, resolved(y), one).steps) == [("allreduce", 0, m * n * ISZ)]
    # 2D SUMMA: X and W stored as q x q blocks; forward gathers X along rows and W along columns
    two = Mesh((q, q), q)
    lin = Linear("s", ISZ, m, k, n)
    s = Strategy(("m", "n"), sharded_weights=True)
    steps = plan(lin.in_shape, ISZ, (S(0), S(1)), lin.sigs(s).x, two).steps + lin.schedule(s, two).forward
    got = sorted(comm(steps))
    assert got == sorted([("allgather", 1, m * k * ISZ // q ** 2), ("allgather", 0, k * n * ISZ // q ** 2)])
    received = sum(b * (q - 1) for _, _, b in got)
    assert received == (q - 1) * (m * k + k * n) * ISZ // q ** 2


placements = st.sampled_from([B, P, S(0), S(1)])


@st.composite
def cases(draw):
    shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3]), min_size=1, max_size=3)))
    src = tuple(draw(placements) for _ in shape)
    dst = tuple(draw(placements) for _ in shape)
    return Mesh(shape, shape[-1]), src, dst


@settings(max_examples=150, deadline=None)
@given(cases(), st.sampled_from([frozenset(), frozenset({0}), frozenset({1}), frozenset({0, 1})]))
def test_plan_steps_applied_symbolically_reach_the_target(case, permutable):
    mesh, src, dst = case
    p = plan((216, 216), ISZ, src, dst, mesh, permutable)
    assert p.feasible, p.reason
    sig = src
    for step in p.steps:
        assert step.src == sig
        sig = apply_step(sig, step)
        assert sig == step.dst
    assert sig == dst
    # the data follows: each device ends with a canonical block of the target, in one global order per dim
    # that only a permutable dim may change; the adjoint (from the target's gradient) restores it
    assert set(p.permuted) <= permutable
    back = adjoint(p, mesh)
    for dim in (0, 1):
        order = index_order(p, dim, mesh, held_indices(p, dim, mesh))
        assert dim in p.permuted or order == list(range(216))
        held = held_indices(plan((216, 216), ISZ, back.src, back.src, mesh), dim, mesh)
        start = {c: [order[i] for i in lst] for c, lst in held.items()}
        assert index_order(back, dim, mesh, held_indices(back, dim, mesh, start)) == list(range(216))


def test_costs_are_non_negative_and_grow_with_bytes(pricer22):
    from analysis.search import Tabulator
    tab = Tabulator(pricer22)
    pairs = [(a, b) for a in [(P, S(0)), (S(1), S(0)), (B, P)] for b in [(B, B), (S(0), S(1)), (S(1), B)]]
    small = tab.plan_seconds((64, 64), ISZ, pairs)
    big = tab.plan_seconds((128, 128), ISZ, pairs)
    assert (small >= 0).all() and (big >= small).all() and (big > small).any()


def test_indivisible_plan_is_infinite_with_reason():
    p = plan((6, 8), ISZ, (B,), (S(0),), Mesh((4,), 4))
    assert not p.feasible and "not divisible" in p.reason


def test_importing_models_leaves_mpi_and_cupy_unimported():
    code = ("import sys, analysis.sbp, analysis.mesh, analysis.redistribute, analysis.layers, analysis.models, "
            "analysis.pricing, analysis.search, analysis.summary, analysis.search_cmd, analysis.predict_cmd, "
            "analysis.ranking, analysis.attribution; "
            "bad = [m for m in ('mpi4py', 'cupy') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_strategy_ids_are_stable_and_enumerated():
    lin = Linear("l", ISZ, 8, 8, 8)
    ids = [s.id for s in lin.strategies(Mesh((2, 2), 2))]
    assert len(ids) == len(set(ids)) == 2 * 4 ** 2 and "m.n" in ids and "-.k/ws" in ids
    assert math.isinf(lin.schedule(Strategy(("x", "m")), Mesh((2, 2), 2)).memory_bytes)


def test_concurrent_groups_of_an_axis_share_each_node_link(pricer22):
    """On a 2x2 mesh both inter-node groups send through each node's one link: each gets half the
    bandwidth, so the calibration is asked at twice the bytes (alpha once, beta twice); within a node,
    and with a link per group, nothing changes."""
    from analysis.pricing import Pricer

    cal, n = pricer22.cal, [1 << 20]
    assert pricer22.mesh.axes[0].link == "inter" and pricer22.mesh.axes[0].groups_per_node == 2
    assert pricer22.seconds("allreduce", 0, n)[0] == pytest.approx(cal.predict_seconds("allreduce", "inter", 2, [2 << 20])[0])
    assert pricer22.seconds("allreduce", 1, n)[0] == pytest.approx(cal.predict_seconds("allreduce", "intra", 2, n)[0])
    own_links = Pricer(cal, pricer22.mesh, nics_per_node=2)
    assert own_links.seconds("allreduce", 0, n)[0] == pytest.approx(cal.predict_seconds("allreduce", "inter", 2, n)[0])
    alone = Pricer(cal, Mesh((2,), 1))               # one rank per node: nothing to share
    assert alone.mesh.axes[0].groups_per_node == 1
    assert alone.seconds("allreduce", 0, n)[0] == pytest.approx(cal.predict_seconds("allreduce", "inter", 2, n)[0])
    # a calibration swept with --concurrent already shared the link between 2 groups per node
    from calib.calibration import calibration_from_dict
    data = json.loads(json.dumps(cal.data))
    data["link_classes"]["inter"]["groups_per_node"] = 2
    shared = calibration_from_dict(data)
    assert Pricer(shared, pricer22.mesh).seconds("allreduce", 0, n)[0] == \
        pytest.approx(shared.predict_seconds("allreduce", "inter", 2, n)[0])
    assert Pricer(shared, alone.mesh).seconds("allreduce", 0, n)[0] == \
        pytest.approx(shared.predict_seconds("allreduce", "inter", 2, [1 << 19])[0])


def test_each_local_computation_pays_the_calibrated_gemm_latency(pricer22):
    """compute = calls x latency + flops / rate; a calibration without latency_s (version < 3) costs flops only."""
    from analysis.pricing import Pricer
    from calib.calibration import calibration_from_dict

    layer = Linear("fc", m=64, k=64, n=64, itemsize=4)
    sched = layer.schedule(layer.strategies(pricer22.mesh)[0], pricer22.mesh)
    computes = [st for st in sched.steps if hasattr(st, "flops")]
    assert len(computes) == 3                         # Y = X W, dX = dY W^T, dW = X^T dY
    _, flops_only = pricer22.price([sched.steps])
    data = json.loads(json.dumps(pricer22.cal.data))
    data["compute"]["gemm"]["float32"]["latency_s"] = 20e-6
    slow = Pricer(calibration_from_dict(data), pricer22.mesh)
    _, with_latency = slow.price([sched.steps])
    assert with_latency[0] == pytest.approx(flops_only[0] + 3 * 20e-6)
    assert slow.breakdown(sched.steps)["compute"] == pytest.approx(with_latency[0])
    assert flops_only[0] == pytest.approx(sum(st.flops for st in computes) / pricer22.flops_per_s)


def test_layout_copies_are_the_ones_the_harness_makes_and_are_priced_where_it_measures_them(pricer22):
    """Blocks cut or joined along an inner dim cost a copy (harness_exec's _split/_join); the outer dim is a
    view. With a copy rate in the calibration the copy is priced in the step's own time."""
    from analysis.pricing import Pricer
    from calib.calibration import calibration_from_dict

    mesh = pricer22.mesh
    inner = plan((64, 64), ISZ, parse_signature("[S(1), B]"), parse_signature("[B, B]"), mesh).steps
    outer = plan((64, 64), ISZ, parse_signature("[S(0), B]"), parse_signature("[B, B]"), mesh).steps
    assert [s.op for s in inner] == ["allgather"] and inner[0].copies == (64 * 64,)
    assert [s.op for s in outer] == ["allgather"] and outer[0].copies == ()
    rs = plan((64, 64), ISZ, parse_signature("[P, B]"), parse_signature("[S(1), B]"), mesh).steps
    assert [s.op for s in rs] == ["reduce_scatter"] and rs[0].copies == (64 * 64,)
    local = plan((64, 64), ISZ, parse_signature("[B, B]"), parse_signature("[B, S(1)]"), mesh).steps
    assert [s.op for s in local] == ["slice"] and local[0].copies == (64 * 32,)
    assert pricer22.step_seconds(inner[0]) == pytest.approx(pricer22.step_seconds(outer[0]))   # no copy rate
    data = json.loads(json.dumps(pricer22.cal.data))
    data["compute"]["copy"] = {"bytes_per_s": 1e9, "latency_s": 2e-6, "n_points": 3, "groups_per_node": 1}
    copying = Pricer(calibration_from_dict(data), mesh)
    copy_s = 2e-6 + 2 * 64 * 64 * ISZ / 1e9
    assert copying.step_seconds(inner[0]) == pytest.approx(copying.step_seconds(outer[0]) + copy_s)
    comm_s, compute_s = copying.price([inner, local])
    assert comm_s[0] == pytest.approx(copying.step_seconds(inner[0])) and compute_s[0] == 0
    assert comm_s[1] == 0 and compute_s[1] == pytest.approx(2e-6 + 2 * 64 * 32 * ISZ / 1e9)
    emb = Embedding("emb", ISZ, vocab=256, dim=16, tokens=64, density=0.25)
    dag = next(s for s in emb.strategies(mesh) if s.choices == ("dag", "dag"))
    sparse = [st for st in emb.schedule(dag, mesh).backward if getattr(st, "op", "") == "allgather"]
    assert sparse and all(st.sparse for st in sparse) and not inner[0].sparse
    lookup, grad = (next(c for c in getattr(emb.schedule(dag, mesh), part) if hasattr(c, "flops"))
                    for part in ("forward", "backward"))
    assert lookup.elements == 2 * 64 // 4 * 16            # the looked-up rows read and written, not the table
    assert grad.elements == 256 * 16 + 2 * 64 // 4 * 16   # the zero-filled table, dY and its rows of dW
    rows = sparse[0].in_shape[0]   # packed rows, what arrives from the group (twice: unpacked and added in)
    assert sparse[0].copies == (rows * 16, 2 * rows * 16, 2 * rows * 16, 2 * rows * 16)
    act = Elementwise("act", ISZ, 64, 64)
    fwd = act.schedule(act.strategies(mesh)[0], mesh).forward
    computes = [c for c in fwd if hasattr(c, "flops")]
    assert computes[0].flops == 0 and computes[0].elements > 0
    assert copying.step_seconds(computes[0]) == pytest.approx(computes[0].elements * ISZ / 1e9)


@pytest.mark.parametrize("ids", [[3, 1, 3, 3, 0, 1], [2, 2, 2, 2], [4, 0, 1], []])
def test_scatter_add_sums_repeated_ids_like_ufunc_at(ids):
    """The harness's level-wise scatter-add equals np.add.at: repeats summed, untouched rows kept."""
    from analysis.kernels import scatter_add
    ids = np.array(ids, dtype=np.int64)
    rows = np.arange(len(ids) * 3, dtype=np.float64).reshape(-1, 3) + 1
    got = np.full((5, 3), 0.5)
    want = got.copy()
    np.add.at(want, ids, rows)
    scatter_add(np, got, ids, rows)
    assert np.array_equal(got, want)


def test_after_compute_looks_past_layout_steps_and_wraps_around_the_schedule():
    """A schedule runs again and again, so its first entries follow its last; slices and relabels are local work,
    passed over: what counts is whether the last computation or collective before an entry is a computation."""
    from types import SimpleNamespace

    from analysis.pricing import after_compute
    comp, comm, local = SimpleNamespace(flops=1.0), SimpleNamespace(is_comm=True), SimpleNamespace(is_comm=False)
    assert after_compute([]) == [] and after_compute([local]) == [False] and after_compute([comm]) == [False]
    assert after_compute([comp, comm]) == [False, True]
    assert after_compute([comm, comp]) == [True, False]            # the first collective follows the last GEMM
    assert after_compute([comp, local, comm]) == [False, True, True]   # a slice between: still after compute
    assert after_compute([comm, local, comm, comp, local]) == [True, False, False, False, True]


def test_collectives_after_a_computation_take_the_after_compute_models(pricer22):
    """A calibration with after-compute models 300 us slower per intra-node call: price() and step_seconds() charge
    that only to the collectives whose last computation or collective before them (after_compute) is a computation,
    in the order the harness runs the schedule (the embedding's backward all-to-alls come before its scatter-add)."""
    from calib.calibration import calibration_from_dict
    from calib.synthetic import synthetic_calibration

    from analysis.pricing import Pricer, after_compute
    data = json.loads(json.dumps(pricer22.cal.data))
    base = {(op, link): (m["alpha_s"], m["beta_s_per_byte"]) for op, by in data["models"].items()
            for link, m in by.items()}
    slow = {k: (a + 300e-6, b) for k, (a, b) in base.items() if k[1] == "intra"}
    mesh = pricer22.mesh
    ctx = Pricer(calibration_from_dict(synthetic_calibration(base, gemm={"float32": 1e13}, after_compute=slow)), mesh)
    kinds = set()
    for layer in (Linear("fc", ISZ, 256, 512, 512), Embedding("emb", ISZ, vocab=256, dim=16, tokens=64)):
        for s in layer.strategies(mesh):
            steps = layer.schedule(s, mesh).steps
            flags = after_compute(steps)
            for f, prev, step in zip(flags[1:], steps, steps[1:]):
                if step.is_comm and (hasattr(prev, "flops") or prev.is_comm):
                    assert f == hasattr(prev, "flops"), (layer.name, s.id, step.describe())
            extra = 0.0
            for step, after in zip(steps, flags):
                if getattr(step, "is_comm", False) and step.link == "intra":
                    kinds.add(after)
                    delta = ctx.step_seconds(step, after) - pricer22.step_seconds(step)
                    # the latency term: 300 us once per round of the collective's algorithm (allreduce: two)
                    assert (delta in (pytest.approx(300e-6), pytest.approx(600e-6))) if after else delta == 0, \
                        (layer.name, s.id, step.describe(), delta)
                    extra += delta
            assert ctx.price([steps])[0][0] == pytest.approx(pricer22.price([steps])[0][0] + extra)
            assert sum(ctx.breakdown(steps).values()) == pytest.approx(sum(ctx.price([steps])[i][0] for i in (0, 1)))
    assert kinds == {True, False}
    emb = Embedding("emb", ISZ, vocab=256, dim=16, tokens=64)
    back = emb.schedule(next(s for s in emb.strategies(mesh) if s.choices == ("r", "r")), mesh).backward
    assert [getattr(step, "op", "compute") for step in back] == ["alltoall", "alltoall", "compute"]


def test_a_layers_strategies_share_one_float64_reference_and_other_data_or_kernels_get_their_own():
    """The harness's reference (the schedule's kernels on the whole float64 data) is computed once per layer's data
    and kernels, not per strategy; new data, or a schedule without the input gradient, gets a reference of its own,
    and each is the plain product."""
    from analysis.harness import layer_data
    from analysis.harness_exec import Runner
    from analysis.models import parse_model

    layer, mesh = parse_model("linear:m=8,k=8,n=16", "float32").layers[0], parse_mesh("2")
    runner = Runner(mesh, (0,), coll=None)

    def refs(data, need_dx=True):
        progs = [runner.program(layer, sc, data, "float32") for st in layer.strategies(mesh)
                 if (sc := layer.schedule(st, mesh, need_dx)).feasible]
        return [{o.name: o.reference for o in p.outputs} for p in progs]
    data, other = layer_data(layer, 0, "float32"), layer_data(layer, 1, "float32")
    first = refs(data)
    assert len(first) > 2 and all(r["Y"] is first[0]["Y"] for r in first)
    assert np.allclose(first[0]["Y"], data["X"].astype(np.float64) @ data["W"].astype(np.float64))
    again = refs(other)
    assert again[0]["Y"] is not first[0]["Y"]
    assert np.allclose(again[0]["Y"], other["X"].astype(np.float64) @ other["W"].astype(np.float64))
    no_dx = refs(other, need_dx=False)
    assert no_dx[0]["Y"] is not again[0]["Y"] and "dX" not in no_dx[0] and "dX" in again[0]
