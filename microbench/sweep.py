"""The sweep: plan every (operation, link class, process count, size) point the job can form,
measure each on a sub-communicator, and hand each finished point to rank 0's store. Runs under MPI."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
from mpi4py import MPI

from microbench import driver, methods, regimes
from microbench.buffers import POOL_BYTES, Pool
from microbench.errors import UsageError
from microbench.ops import COMM_DTYPE, Layout, Op, compute_phase, itemsize
from microbench.records import PointKey, PointSummary
from microbench.sizes import format_size
from microbench.stats import StopRule, pooled_estimate, round_spread
from microbench.switches import Topology
from microbench.topology import Group, group_for, groups_per_node, tiles


@dataclass(frozen=True)
class SweepConfig:
    ops: tuple[Op, ...]
    sizes: tuple[int, ...]
    procs: tuple[int, ...]
    links: tuple[str, ...]
    rule: StopRule
    backend: str = "mpi"
    gemm_sizes: tuple[int, ...] = ()
    dtypes: dict[str, tuple[str, ...]] = field(default_factory=dict)   # local op -> element types (default: its own)
    in_place: bool = False
    retries: int = 1
    concurrent: bool = False
    rounds: int = 3
    cache: str = "cold"
    gap_ms: float = 0.0
    after_gemm: int = 0
    method: str = "commcal"      # methods.METHODS: commcal's own timing, or a peer's (a reference mode)
    topology: Topology = Topology()   # the job's switch levels (restricted to its nodes); flat: one inter level
    bisect: int = 0              # passes measuring the middle of each interval whose time outgrows its size
    held_out: tuple[int, ...] = ()   # sizes measured as the others but never bisected at (a fit's check)


@dataclass(frozen=True)
class PlannedPoint:
    key: PointKey
    op: Op
    group: Group                 # the group world rank 0 measures in
    layout: Layout
    tiles: tuple[Group, ...] = ()   # every group measured at once (one, unless concurrent); () means (group,)
    groups_per_node: int = 1

    @property
    def groups(self) -> tuple[Group, ...]:
        return self.tiles or (self.group,)


def plan(cfg: SweepConfig, hosts: list[str], extra: dict[tuple[str, str, int], list[int]] | None = None
         ) -> list[PlannedPoint]:
    """Every point this job can form, in measuring order. Point-to-point runs at 2 ranks; gemm and copy on
    rank 0, or on every rank at once when concurrent. In a reference mode (cfg.method) each size is in the peer's
    convention (the point's requested_bytes) and the element type is the peer's. `extra`: more sizes of some
    (op, link, procs), the bisection's."""
    method = methods.method_for(cfg.method)
    points = []
    for op in cfg.ops:
        if op.kind == "compute":
            group = Group("intra", 1, 1, 1, (0,))
            together = tiles("intra", 1, hosts) if cfg.concurrent else (group,)
            per_node = groups_per_node(together, hosts)
            for dtype in cfg.dtypes.get(op.name, op.dtypes):
                for size in cfg.gemm_sizes or cfg.sizes:
                    lay = op.layout(size, 1, itemsize(dtype))
                    key = PointKey(cfg.backend, op.name, "intra", 1, size, dtype, len(together))
                    points.append(PlannedPoint(key, op, group, lay, together, per_node))
            continue
        counts = (2,) if op.kind == "p2p" else cfg.procs
        for link in cfg.links:
            for p in counts:
                group = group_for(link, p, hosts, cfg.topology) if p >= 2 or (p == 1 and link == "intra") else None
                if group is None:
                    continue
                together = tiles(link, p, hosts, cfg.topology) if cfg.concurrent else (group,)
                per_node = groups_per_node(together, hosts)
                dtype = method.dtype(op.name)
                more = (extra or {}).get((op.name, link, p), [])
                for size in sorted(set(cfg.sizes) | set(cfg.held_out) | set(more)):
                    lay = replace(op.layout(method.commcal_bytes(op.name, size, p), p, itemsize(dtype)),
                                  requested_bytes=size)
                    key = PointKey(cfg.backend, op.name, link, p, size, dtype, len(together))
                    points.append(PlannedPoint(key, op, group, lay, together, per_node))
    return points


def available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (bytes); a large number where unknown."""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def check_memory(points: list[PlannedPoint], per_rank_bytes: int, cache: str = "cold") -> None:
    """Refuse, before allocating anything, sizes whose buffers (send, receive, the check's expected copy
    and, for cold buffers, the pool) cannot fit in this rank's share of the node's available memory."""
    for pt in points:
        check_fits(pt.op.name, pt.key.requested_bytes, pt.layout, per_rank_bytes, POOL_BYTES if cache == "cold" else 0)


def check_fits(name: str, requested: int, layout, per_rank_bytes: int, pool: int = 0) -> None:
    """UsageError where operation `name` at `requested` bytes (its `layout`: send, receive and the check's expected
    copy, with `pool` bytes of cold buffers) cannot fit in `per_rank_bytes`, or exceeds MPI's element count."""
    need = layout.buffer_bytes + layout.recv_count * layout.itemsize + pool
    if need > per_rank_bytes:
        raise UsageError(f"size {format_size(requested)} for {name} needs {format_size(need)}B "
                         f"per rank but only {format_size(per_rank_bytes)}B is available per rank")
    if max(layout.send_count, layout.recv_count) >= 2**31:
        raise UsageError(f"size {format_size(layout.size_bytes)} for {name} exceeds MPI's 2^31-element count")


@dataclass(frozen=True)
class Pooled:
    """One point's visits so far (rank 0 reads them back from the run directory; the whole sweep's samples need
    not fit in memory): every sample, the round it was taken in, wrong elements.
    A point's median comes from several passes over the sweep because a shared machine's speed drifts over
    seconds: one contiguous window gives a tight CI around a median that another window does not reproduce."""

    samples: np.ndarray = field(default_factory=lambda: np.empty(0))
    rounds: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    wrong: int = 0
    launches: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))

    def add(self, m: driver.Measurement, launch: int) -> Pooled:
        """These visits and one more (numbered after the last), taken in MPI launch `launch`."""
        rnd = int(self.rounds.max()) + 1 if len(self.rounds) else 0
        new = np.full(len(m.samples), rnd, dtype=np.int64)
        return Pooled(np.concatenate([self.samples, m.samples]), np.concatenate([self.rounds, new]),
                      self.wrong + m.wrong, np.concatenate([self.launches, np.full_like(new, launch)]))

    @property
    def visits(self) -> int:
        return len(np.unique(self.rounds))

    def per_visit(self) -> list[np.ndarray]:
        return [self.samples[self.rounds == r] for r in np.unique(self.rounds)]

    def per_launch(self) -> list[np.ndarray]:
        return [self.samples[self.launches == k] for k in np.unique(self.launches)]


def summarize(run_id: str, pt: PlannedPoint, m: driver.Measurement, pooled: Pooled, rule: StopRule,
              timing_path: str) -> PointSummary:
    """The record of a point's pooled visits (`m` is the latest)."""
    visits = pooled.per_visit()
    est, lay, p = pooled_estimate(visits), pt.layout, pt.group.procs
    algbw = lay.size_bytes / est.median if est.median > 0 else 0.0
    return PointSummary(
        run_id=run_id, point_id=pt.key.point_id, backend=pt.key.backend, op=pt.op.name, link=pt.group.link,
        nodes=pt.group.nodes, ranks_per_node=pt.group.ranks_per_node, procs=p,
        requested_bytes=pt.key.requested_bytes, size_bytes=lay.size_bytes, count=lay.send_count,
        dtype=pt.key.dtype, bytes_per_rank=pt.op.bytes_per_rank(lay.size_bytes, p), in_place=m.in_place,
        timing_path=timing_path if pt.op.kind != "compute" else "python", samples=est.samples,
        median_s=est.median, ci_low_s=est.ci_low, ci_high_s=est.ci_high, min_s=est.min, p95_s=est.p95,
        mean_s=est.mean, target_ci=rule.target_ci, target_met=rule.met(est), algbw_Bps=algbw,
        busbw_Bps=algbw * pt.op.bus_factor(p), wrong=pooled.wrong, flops=m.flops,
        flops_per_s=m.flops / est.median if m.flops and est.median > 0 else 0.0,
        groups=len(pt.groups), groups_per_node=pt.groups_per_node, rounds=pooled.visits,
        round_spread=round_spread(visits, est.median), launches=len(np.unique(pooled.launches)),
        launch_spread=round_spread(pooled.per_launch(), est.median))


def idle_until(req: MPI.Request) -> None:
    """Wait on a non-blocking barrier without spinning, so idle ranks leave the cores to the measured ones."""
    while not req.Test():
        time.sleep(0.0005)


@dataclass
class Progress:
    """Rank 0's table of finished visits, with a running count and a time estimate."""

    total: int
    skipped: int = 0
    stream: Any = field(default=sys.stdout)
    started: float = field(default_factory=time.monotonic)
    finished: int = 0

    def header(self) -> None:
        print(f"{'visit':>9}  {'op':<14} {'link':<6} {'p':>3} {'size':>6}  {'median':>10} {'CI +-':>6} "
              f"{'n':>6}  {'busbw':>11}  {'ok':<4} {'drift':>6}", file=self.stream, flush=True)

    def row(self, s: PointSummary, retry: str = "") -> None:
        if not retry:
            self.finished += 1
        elapsed = time.monotonic() - self.started
        eta = elapsed / self.finished * (self.total - self.skipped - self.finished)
        half = s.ci_rel_half_width * 100
        rate = (f"{s.flops_per_s / 1e9:8.2f} GF/s" if s.flops else f"{s.busbw_Bps / 1e9:8.3f} GB/s")
        flag = "ok" if s.wrong == 0 else f"WRONG {s.wrong}"
        mark = "" if s.target_met else "*"
        where = retry or f"{self.finished + self.skipped:>4}/{self.total:<4}"
        print(f"{where:>9}  {s.op:<14} {s.link:<6} {s.procs:>3} "
              f"{format_size(s.size_bytes):>6}  {s.median_s * 1e6:8.2f}us {half:5.1f}%{mark} {s.samples:>6}  "
              f"{rate}  {flag}  {s.round_spread * 100:5.1f}%  eta {eta:4.0f}s", file=self.stream, flush=True)


def resized(pt: PlannedPoint, size: int) -> PlannedPoint:
    """The point of pt's operation, group and element type at another size (commcal's size convention)."""
    lay = replace(pt.op.layout(size, pt.group.procs, itemsize(pt.key.dtype)), requested_bytes=size)
    return replace(pt, key=replace(pt.key, requested_bytes=size), layout=lay)


def bisections(points: list[PlannedPoint], summary: pd.DataFrame, held_out: tuple[int, ...]) -> list[tuple[int, int]]:
    """(index of a point of the series, size) for each middle of an interval where the series' time outgrows its
    size (microbench.regimes.middles, over the sweep's summaries so far) that no planned point measures yet (a
    held-out point does not count: it stays out of what a fit sees)."""
    moved = {(pt.op.name, pt.group.link, pt.group.procs, pt.layout.size_bytes) for pt in points
             if pt.key.requested_bytes not in held_out}
    ids = {pt.key.point_id for pt in points}
    first = {}
    for i, pt in enumerate(points):
        first.setdefault((pt.op.name, pt.group.link, pt.group.procs), i)
    out = []
    for series, sizes in regimes.middles(summary, frozenset(held_out)).items():
        if series not in first:
            continue
        pt = points[first[series]]
        for size in sizes:
            while resized(pt, size).key.point_id in ids:      # a held-out point's size: a point of its own
                size += itemsize(pt.key.dtype)
            if (*series, resized(pt, size).layout.size_bytes) not in moved:
                out.append((first[series], size))
    return out


def run_points(world: MPI.Comm, points: list[PlannedPoint], done: dict[str, int], cfg: SweepConfig, run_id: str,
               timer: Any, store: Any, backend: Any, launch: int = 0, bisected: int = 0) -> int:
    """Visit every planned point cfg.rounds times, in passes over the plan (each visit with its share of the point
    budget), pooling the samples and checking results before the first visit and after the last; `done` holds
    the visits already on disk and `launch` numbers this MPI launch of the run. Then, up to cfg.bisect passes in
    all (`bisected` were made by earlier launches), measure as many rounds the middle of each interval where the time
    grows faster than the size, a regime change the grid would hide (microbench.regimes), and record them in the
    store. Then visit again (up to cfg.retries times, at the end) the points whose pooled CI missed the target.
    Every visit is on disk before the next starts. Returns the number of wrong elements seen."""
    comms: dict[tuple[str, int, int], tuple[MPI.Comm, MPI.Comm]] = {}
    for pt in points:   # every rank creates the same sub-communicators in the same order
        k = (pt.group.link, pt.group.procs, len(pt.groups))
        if k not in comms:
            comms[k] = _split(world, pt.groups)
    rule = cfg.rule.visit(cfg.rounds)
    pool = Pool(backend.xp) if cfg.cache == "cold" else None
    before = compute_phase(backend, cfg.after_gemm) if cfg.after_gemm else None
    progress = None
    if world.rank == 0:
        skipped = sum(min(done.get(pt.key.point_id, 0), cfg.rounds) for pt in points)
        progress = Progress(len(points) * cfg.rounds, skipped)
        progress.header()
    wrong = 0
    unmet: set[str] = set()                  # rank 0: points whose pooled result misses the target

    def measure(pt: PlannedPoint, retry: str, checks: tuple[bool, bool]) -> None:
        nonlocal wrong
        comm, ctrl = comms[(pt.group.link, pt.group.procs, len(pt.groups))]
        if comm != MPI.COMM_NULL:
            if pt.op.kind == "compute":
                together = ctrl if len(pt.groups) > 1 else None
                m = driver.measure_local(pt.op, pt.layout, pt.key.dtype, rule, backend, together, pool)
            elif cfg.method != "commcal":
                m = driver.measure_peer(pt.op, comm, pt.layout, pt.key.dtype, rule, timer, backend,
                                        methods.method_for(cfg.method), checks)
            else:
                in_place = cfg.in_place and pt.op.name in backend.in_place_ops
                m = driver.measure_collective(pt.op, comm, pt.layout, pt.key.dtype, rule, timer, backend, in_place,
                                              ctrl, checks, pool, cfg.gap_ms / 1e3, before)
            if world.rank == 0:
                pid = pt.key.point_id
                earlier = Pooled(*store.read_point(pid)) if store.has_point(pid) else Pooled()
                pooled = earlier.add(m, launch)
                s = summarize(run_id, pt, m, pooled, cfg.rule, timer.path)
                wrong += m.wrong
                store.write_point(s, pooled.samples, pooled.rounds, pooled.launches)
                (unmet.discard if s.target_met else unmet.add)(pid)
                progress.row(s, retry)
        idle_until(world.Ibarrier())

    for rnd in range(cfg.rounds):
        for pt in points:
            if done.get(pt.key.point_id, 0) <= rnd:
                measure(pt, "", (rnd == 0, rnd == cfg.rounds - 1))
    for bisect_pass in range(bisected + 1, cfg.bisect + 1):
        ids = [pt.key.point_id for pt in points]
        found = world.bcast(bisections(points, store.summaries(ids), cfg.held_out) if world.rank == 0 else None,
                            root=0)
        if not found:
            break
        new = [resized(points[i], size) for i, size in found]
        points = points + new
        if world.rank == 0:
            store.add_bisected([pt.key for pt in new], bisect_pass)
            progress.total += len(new) * cfg.rounds
        for rnd in range(cfg.rounds):
            for pt in new:
                measure(pt, "", (rnd == 0, rnd == cfg.rounds - 1))
    for attempt in range(1, cfg.retries + 1):
        again = world.bcast(unmet if world.rank == 0 else None, root=0)
        for pt in points:
            if pt.key.point_id in again:
                measure(pt, f"retry {attempt}", (False, True))
    for pair in comms.values():
        for comm in {id(c): c for c in pair}.values():
            if comm != MPI.COMM_NULL:
                comm.Free()
    return world.bcast(wrong, root=0)


def _split(world: MPI.Comm, groups: tuple[Group, ...]) -> tuple[MPI.Comm, MPI.Comm]:
    """(this rank's group communicator, the control communicator over every group measured at once);
    COMM_NULL where this rank is in none. With one group the two are the same communicator."""
    mine = next((i for i, g in enumerate(groups) if world.rank in g.ranks), None)
    comm = world.Split(MPI.UNDEFINED if mine is None else mine,
                       key=0 if mine is None else groups[mine].ranks.index(world.rank))
    if len(groups) == 1:
        return comm, comm
    return comm, world.Split(MPI.UNDEFINED if mine is None else 0, key=world.rank)
