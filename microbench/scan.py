"""The scan: every node pair's ping-pong at each size, in the round-robin schedule's rounds of disjoint pairs that
run at once, then every node's copy and GEMM rate, all nodes at once. One rank per node. Runs under MPI."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from microbench import driver
from microbench.ops import COMM_DTYPE, OPS, itemsize
from microbench.scanfile import NODE_OPS, ScanConfig, Recheck, ScanRow, Suspects, merge_rechecks
from microbench.schedule import round_robin
from microbench.sizes import format_size
from microbench.stats import Estimate, StopRule, pooled_estimate
from microbench.sweep import idle_until


def _row(kind: str, a: str, b: str, rnd: int, op: str, size: int, est: Estimate, rule: StopRule, rate_of: float,
         wrong: int) -> ScanRow:
    return ScanRow(kind, a, b, rnd, op, size, est.samples, est.median, est.ci_low, est.ci_high,
                   rule.met(est), rate_of / est.median if est.median > 0 else 0.0, wrong)


def measure_pairs(world: MPI.Comm, nodes: list[str], cfg: ScanConfig, timer, backend, say,
                  only: tuple[tuple[str, str], ...] | None = None) -> list[ScanRow]:
    """Rank 0's rows of every pair at every size: each round's pairs measure one size at once, each with its own
    stopping rule (a slow pair must not set another's times), and the next size (and round) starts when every pair
    is done, so that no pair's latency is timed beside another's bulk transfer. Waiting ranks sleep, leaving the
    cores to the measuring ones. With `only`, one pass over the rounds that hold those pairs, those pairs alone."""
    op = OPS["pingpong"]
    schedule = round_robin(len(nodes))
    wanted = None if only is None else set(only)
    passes = 1 if only is not None else cfg.rounds
    rule = cfg.rule.visit(passes)
    layouts = [op.layout(size, 2, itemsize(COMM_DTYPE)) for size in cfg.sizes]
    visits: dict[int, list[list[np.ndarray]]] = {}      # this rank's pairs (as the lower rank): round -> per size
    wrong: dict[int, int] = {}
    for rep in range(passes):
        for rnd, all_pairs in enumerate(schedule):
            pairs = [p for p in all_pairs if wanted is None or (nodes[p[0]], nodes[p[1]]) in wanted]
            if not pairs:
                continue
            mine = next((i for i, pair in enumerate(pairs) if world.rank in pair), None)
            comm = world.Split(MPI.UNDEFINED if mine is None else mine,
                               key=0 if mine is None else pairs[mine].index(world.rank))
            for i, lay in enumerate(layouts):
                if comm != MPI.COMM_NULL:
                    m = driver.measure_collective(op, comm, lay, COMM_DTYPE, rule, timer, backend,
                                                  checks=(rep == 0, rep == passes - 1))
                    visits.setdefault(rnd, [[] for _ in layouts])[i].append(m.samples)
                    wrong[rnd] = wrong.get(rnd, 0) + m.wrong
                idle_until(world.Ibarrier())
            if comm != MPI.COMM_NULL:
                comm.Free()
            if world.rank == 0 and say:
                say(("recheck" if only is not None else f"pass {rep + 1}/{passes}")
                    + f" round {rnd + 1}/{len(schedule)}: " + ", ".join(f"{nodes[a]}-{nodes[b]}" for a, b in pairs))
    rows = []
    for rnd, pairs in enumerate(schedule):
        for a, b in pairs:
            if world.rank == a and rnd in visits:
                for lay, samples in zip(layouts, visits[rnd]):
                    rows.append(_row("pair", nodes[a], nodes[b], rnd, op.name, lay.size_bytes,
                                     pooled_estimate(samples), cfg.rule, lay.size_bytes, wrong[rnd]))
    return _gathered(world, rows)


def _gathered(world: MPI.Comm, rows: list[ScanRow]) -> list[ScanRow]:
    """Every rank's rows on rank 0, in rank order; empty elsewhere."""
    parts = world.gather(rows, root=0)
    return [r for part in parts for r in part] if world.rank == 0 else []


def measure_nodes(world: MPI.Comm, nodes: list[str], cfg: ScanConfig, backend,
                  only: tuple[str, ...] | None = None) -> list[ScanRow]:
    """Rank 0's rows of every node's copy and GEMM rate (or those of the nodes `only`), every such node measuring
    at once and alone (no max over nodes: each keeps its own times)."""
    rows = []
    for name, size in zip(NODE_OPS, (cfg.copy_size, cfg.gemm_size)):
        op = OPS[name]
        lay = op.layout(size, 1, itemsize(COMM_DTYPE))
        if only is None or nodes[world.rank] in only:
            m = driver.measure_local(op, lay, COMM_DTYPE, cfg.rule, backend)
            work = m.flops if m.flops else op.bytes_per_rank(lay.size_bytes, 1)
            rows.append(_row("node", nodes[world.rank], "", -1, name, lay.size_bytes, m.estimate, cfg.rule, work,
                             m.wrong))
        idle_until(world.Ibarrier())
    return _gathered(world, rows)


def recheck(world: MPI.Comm, nodes: list[str], cfg: ScanConfig, timer, backend, rows: list[ScanRow],
            suspects: Suspects, say) -> tuple[list[ScanRow], list[Recheck]]:
    """Measure each suspect once more (the suspect pairs in their schedule rounds, the suspect nodes at once; at
    most one more pass) and merge (`merge_rechecks`): rank 0's rows and a record of each second look. Every rank
    calls this with the same suspects."""
    again = measure_pairs(world, nodes, cfg, timer, backend, say, only=suspects.pairs) if suspects.pairs else []
    if suspects.nodes:
        if say:
            say(f"recheck: {', '.join(suspects.nodes)}")
        again += measure_nodes(world, nodes, cfg, backend, only=suspects.nodes)
    return merge_rechecks(rows, again)


def summary_lines(rows: list[ScanRow]) -> list[str]:
    """One line per measurement, for the job's log."""
    out = []
    for r in rows:
        what = f"{r.node_a}-{r.node_b}" if r.kind == "pair" else r.node_a
        rate = f"{r.rate / 1e9:8.2f} GF/s" if r.op == "gemm" else f"{r.rate / 1e6:8.1f} MB/s"
        out.append(f"{r.op:<9} {what:<24} {format_size(r.size_bytes):>6} {r.median_s * 1e6:11.2f}us {rate}"
                   + ("" if r.target_met else "  (CI target missed)") + (f"  WRONG {r.wrong}" if r.wrong else ""))
    return out
