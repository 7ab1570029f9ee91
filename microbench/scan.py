"""The scan: every node pair's ping-pong at each size, in the round-robin schedule's rounds of disjoint pairs that
run at once, then every node's copy and GEMM rate, all nodes at once. One rank per node. Runs under MPI."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from microbench import driver
from microbench.ops import COMM_DTYPE, OPS, itemsize
from microbench.scanfile import NODE_OPS, ScanConfig, ScanRow
from microbench.schedule import round_robin
from microbench.sizes import format_size
from microbench.stats import Estimate, StopRule, pooled_estimate
from microbench.sweep import idle_until


def _row(kind: str, a: str, b: str, rnd: int, op: str, size: int, est: Estimate, rule: StopRule, rate_of: float,
         wrong: int) -> ScanRow:
    return ScanRow(kind, a, b, rnd, op, size, est.samples, est.median, est.ci_low, est.ci_high,
                   rule.met(est), rate_of / est.median if est.median > 0 else 0.0, wrong)


def measure_pairs(world: MPI.Comm, nodes: list[str], cfg: ScanConfig, timer, backend, say) -> list[ScanRow]:
    """Rank 0's rows of every pair at every size: each round's pairs measure one size at once, each with its own
    stopping rule (a slow pair must not set another's times), and the next size (and round) starts when every pair
    is done, so that no pair's latency is timed beside another's bulk transfer. Waiting ranks sleep, leaving the
    cores to the measuring ones."""
    op = OPS["pingpong"]
    schedule = round_robin(len(nodes))
    rule = cfg.rule.visit(cfg.rounds)
    layouts = [op.layout(size, 2, itemsize(COMM_DTYPE)) for size in cfg.sizes]
    visits: dict[int, list[list[np.ndarray]]] = {}      # this rank's pairs (as the lower rank): round -> per size
    wrong: dict[int, int] = {}
    for rep in range(cfg.rounds):
        for rnd, pairs in enumerate(schedule):
            mine = next((i for i, pair in enumerate(pairs) if world.rank in pair), None)
            comm = world.Split(MPI.UNDEFINED if mine is None else mine,
                               key=0 if mine is None else pairs[mine].index(world.rank))
            for i, lay in enumerate(layouts):
                if comm != MPI.COMM_NULL:
                    m = driver.measure_collective(op, comm, lay, COMM_DTYPE, rule, timer, backend,
                                                  checks=(rep == 0, rep == cfg.rounds - 1))
                    visits.setdefault(rnd, [[] for _ in layouts])[i].append(m.samples)
                    wrong[rnd] = wrong.get(rnd, 0) + m.wrong
                idle_until(world.Ibarrier())
            if comm != MPI.COMM_NULL:
                comm.Free()
            if world.rank == 0 and say:
                say(f"pass {rep + 1}/{cfg.rounds} round {rnd + 1}/{len(schedule)}: "
                    + ", ".join(f"{nodes[a]}-{nodes[b]}" for a, b in pairs))
    rows = []
    for rnd, pairs in enumerate(schedule):
        for a, b in pairs:
            if world.rank == a:
                for lay, samples in zip(layouts, visits[rnd]):
                    rows.append(_row("pair", nodes[a], nodes[b], rnd, op.name, lay.size_bytes,
                                     pooled_estimate(samples), cfg.rule, lay.size_bytes, wrong[rnd]))
    gathered = world.gather(rows, root=0)
    return [r for part in gathered for r in part] if world.rank == 0 else []


def measure_nodes(world: MPI.Comm, nodes: list[str], cfg: ScanConfig, backend) -> list[ScanRow]:
    """Rank 0's rows of every node's copy and GEMM rate, every node measuring at once and alone (no max over
    nodes: each keeps its own times)."""
    rows = []
    for name, size in zip(NODE_OPS, (cfg.copy_size, cfg.gemm_size)):
        op = OPS[name]
        lay = op.layout(size, 1, itemsize(COMM_DTYPE))
        m = driver.measure_local(op, lay, COMM_DTYPE, cfg.rule, backend)
        work = m.flops if m.flops else op.bytes_per_rank(lay.size_bytes, 1)
        rows.append(_row("node", nodes[world.rank], "", -1, name, lay.size_bytes, m.estimate, cfg.rule, work,
                         m.wrong))
        idle_until(world.Ibarrier())
    gathered = world.gather(rows, root=0)
    return [r for part in gathered for r in part] if world.rank == 0 else []


def summary_lines(rows: list[ScanRow]) -> list[str]:
    """One line per measurement, for the job's log."""
    out = []
    for r in rows:
        what = f"{r.node_a}-{r.node_b}" if r.kind == "pair" else r.node_a
        rate = f"{r.rate / 1e9:8.2f} GF/s" if r.op == "gemm" else f"{r.rate / 1e6:8.1f} MB/s"
        out.append(f"{r.op:<9} {what:<24} {format_size(r.size_bytes):>6} {r.median_s * 1e6:11.2f}us {rate}"
                   + ("" if r.target_met else "  (CI target missed)") + (f"  WRONG {r.wrong}" if r.wrong else ""))
    return out
