"""Scale on paper: how long a sweep and a scan take on N nodes with G ranks (devices) each, and how a sweep splits
into allocations that each fit a time limit. Pure: it prices the sweep's own plan (sweep.plan's points, visits,
budgets and stopping rule) and the scan's round-robin schedule with an alpha-beta model of an assumed machine
(docs/methodology.md, "Scale on paper")."""

from __future__ import annotations

import math
import argparse
from dataclasses import dataclass

from microbench.errors import UsageError
from microbench.limits import MAX_RANKS
from microbench.links import link_level
from microbench.schedule import round_count
from microbench.stats import StopRule, median_ci_ranks

MIN_CI_SAMPLES = next(n for n in range(1, 100) if median_ci_ranks(n))
"""The fewest samples with a 95% CI of the median: a visit cannot meet its target with fewer."""


@dataclass(frozen=True)
class Machine:
    """The assumed machine: a latency and a per-node bandwidth within a node ("intra") and across the network
    ("inter", for every link class between nodes: a node's ranks share its network bandwidth), a rank's copy and
    GEMM rates, and what starting a job step costs."""

    alpha_s: dict
    bandwidth_Bps: dict
    copy_Bps: float = 20e9
    gemm_flops: float = 50e12
    launch_s: float = 30.0
    launch_per_rank_s: float = 1e-3

    @classmethod
    def default(cls, inter_alpha_s: float = 3e-6, inter_Bps: float = 25e9) -> Machine:
        """An InfiniBand-class network (3 us, 25 GB/s per node by default) and NVLink-class links within a node
        (2 us, 150 GB/s)."""
        return cls({"intra": 2e-6, "inter": inter_alpha_s}, {"intra": 150e9, "inter": inter_Bps})

    def launch(self, ranks: int) -> float:
        return self.launch_s + self.launch_per_rank_s * ranks

    def call_s(self, link: str, procs: int, nbytes: float, ranks_per_node: int = 1) -> float:
        """One timed iteration: the barrier before it and the call, alpha per step of a log-depth algorithm plus
        the bytes each rank moves at its share of the link."""
        steps = max(1, math.ceil(math.log2(max(procs, 2))))
        where = "intra" if link_level(link) == 0 else "inter"
        return 2 * steps * self.alpha_s[where] + nbytes * ranks_per_node / self.bandwidth_Bps[where]


def visit_s(per_iter_s: float, rule: StopRule) -> tuple[float, float]:
    """(quiet, worst) seconds of one visit under `rule` (a visit's share): warm-up as the driver does it, then the
    minimum samples where the CI target is met at once, or the whole budget where it never is."""
    warm = 2 + int(min(20, 0.05 * rule.budget_s / max(per_iter_s, 1e-9)))
    samples = rule.min_samples
    while samples < MIN_CI_SAMPLES:              # the batches StopRule.next_batch plans until a CI exists
        samples += max(samples // 2, 8)
    quiet = (warm + samples) * per_iter_s
    return quiet, max(quiet, rule.budget_s + warm * per_iter_s)


@dataclass(frozen=True)
class Estimate:
    """A job's estimate: its visits (in measuring order, worst-case seconds each), and its quiet and worst time."""

    what: str
    ranks: int
    visits: tuple[float, ...]
    quiet_s: float
    worst_s: float
    launch_s: float

    def chunks(self, limit_s: float, margin: float = 0.9) -> list[tuple[int, int, float]]:
        """Consecutive visits that fit `margin` of an allocation of `limit_s` after its launch, worst case:
        [(first visit, last visit, seconds)]. Empty where a single visit does not fit."""
        usable = margin * limit_s - self.launch_s
        out, start, total = [], 0, 0.0
        for i, t in enumerate(self.visits):
            if t > usable:
                return []
            if total + t > usable:
                out.append((start, i - 1, total))
                start, total = i, 0.0
            total += t
        if self.visits:
            out.append((start, len(self.visits) - 1, total))
        return out


def sweep_estimate(points, rounds: int, retries: int, rule: StopRule, machine: Machine, ranks: int) -> Estimate:
    """The sweep of `points` (sweep.plan's) over `rounds` passes, then `retries` more of every point in the worst
    case (the quiet case needs none)."""
    visit_rule = rule.visit(rounds)
    quiet_total, per_pass = 0.0, []
    for pt in points:
        if pt.op.kind == "compute":
            work = pt.layout.block ** 3 * 2 / machine.gemm_flops if pt.op.name == "gemm" else \
                pt.op.bytes_per_rank(pt.layout.size_bytes, 1) / machine.copy_Bps
        else:
            work = machine.call_s(pt.group.link, pt.group.procs,
                                  pt.op.bytes_per_rank(pt.layout.size_bytes, pt.group.procs) * (2 if pt.op.kind == "p2p" else 1),
                                  pt.group.ranks_per_node * pt.groups_per_node)
        quiet, worst = visit_s(work, visit_rule)
        quiet_total += quiet
        per_pass.append(worst)
    visits = tuple(per_pass) * (rounds + retries)
    launch = machine.launch(ranks)
    return Estimate("sweep", ranks, visits, launch + rounds * quiet_total, launch + sum(visits), launch)


def scan_estimate(nodes: int, sizes: list[int], rounds: int, rule: StopRule, machine: Machine,
                  node_checks: tuple[float, float], recheck: bool = True) -> Estimate:
    """The scan of `nodes` nodes: `rounds` passes over the round-robin schedule, each round as long as one pair's
    ping-pongs at every size (the pairs run at once), then the node checks (copy bytes, GEMM flops per iteration);
    in the worst case the recheck measures every pair (one more pass at the whole budget) and every node again."""
    split_s = machine.call_s("inter", nodes, 0) * 2        # the round's communicator split and closing barrier
    rounds_per_pass = round_count(nodes)

    def round_s(visit_rule: StopRule) -> tuple[float, float]:
        times = [visit_s(machine.call_s("inter", 2, 2 * size), visit_rule) for size in sizes]
        return sum(t[0] for t in times), sum(t[1] for t in times) + split_s

    quiet, worst = round_s(rule.visit(rounds))
    visits = [worst] * (rounds_per_pass * rounds)
    checks = [visit_s(node_checks[0] / machine.copy_Bps, rule), visit_s(node_checks[1] / machine.gemm_flops, rule)]
    visits += [c[1] for c in checks]
    if recheck:
        visits += [round_s(rule)[1]] * rounds_per_pass + [c[1] for c in checks]
    launch = machine.launch(nodes)
    return Estimate("scan", nodes, tuple(visits),
                    launch + rounds_per_pass * rounds * (quiet + split_s) + sum(c[0] for c in checks),
                    launch + sum(visits), launch)


DRY_DEFAULTS = {"nodes": None, "gpus_per_node": 1, "time_limit": None, "assume_latency_us": 3.0,
                "assume_bandwidth": 25.0}
"""The options only a --dry-run reads, and what it takes for each left out (None: nothing, or an error)."""


def add_arguments(p: argparse.ArgumentParser, ranks_help: str) -> None:
    """--dry-run and what it plans for: the allocation's shape and time limit, and the assumed network (each left
    None when not given, so that a real run can refuse them)."""
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan and its estimated time for --nodes and --gpus-per-node, without MPI")
    p.add_argument("--nodes", type=int, help="with --dry-run: nodes of the allocation")
    p.add_argument("--gpus-per-node", type=int,
                   help=f"with --dry-run: {ranks_help} (default {DRY_DEFAULTS['gpus_per_node']})")
    p.add_argument("--time-limit", metavar="HH:MM:SS",
                   help="with --dry-run: one allocation's time limit; prints how the work splits into allocations")
    p.add_argument("--assume-latency-us", type=float,
                   help="with --dry-run: the network's latency in the alpha-beta model "
                        f"(default {DRY_DEFAULTS['assume_latency_us']:g})")
    p.add_argument("--assume-bandwidth", type=float, metavar="GB/s",
                   help="with --dry-run: each node's network bandwidth in the model "
                        f"(default {DRY_DEFAULTS['assume_bandwidth']:g})")


def dry(args: argparse.Namespace) -> bool:
    """Whether this is a --dry-run; a real run must name its --out and give none of the options only a dry run
    reads (it would ignore them)."""
    if not args.dry_run:
        given = [f"--{name.replace('_', '-')}" for name in DRY_DEFAULTS if getattr(args, name) is not None]
        if given:
            raise UsageError(f"{', '.join(given)}: only a --dry-run plans with these; a real run measures the "
                             f"allocation it runs in (add --dry-run, or drop them)")
    if not (args.dry_run or args.out):
        raise UsageError("--out DIR is required (or --dry-run)")
    return bool(args.dry_run)


@dataclass(frozen=True)
class DryRun:
    nodes: int
    per_node: int
    limit_s: float | None
    machine: Machine


def dry_run(args: argparse.Namespace) -> DryRun:
    """The dry run's allocation and machine from arguments (UsageError for bad ones)."""
    a = argparse.Namespace(**{name: DRY_DEFAULTS[name] if getattr(args, name) is None else getattr(args, name)
                              for name in DRY_DEFAULTS})
    if a.nodes is None or a.nodes < 1:
        raise UsageError("--dry-run needs --nodes N (1 or more)")
    if a.gpus_per_node < 1:
        raise UsageError("--gpus-per-node must be 1 or more")
    if a.nodes * a.gpus_per_node > MAX_RANKS:
        raise UsageError(f"--dry-run plans up to {MAX_RANKS} ranks, not {a.nodes} x {a.gpus_per_node}")
    if not (1e-9 <= a.assume_latency_us <= 1e9 and 1e-9 <= a.assume_bandwidth <= 1e9):
        raise UsageError("--assume-latency-us and --assume-bandwidth must lie in 1e-9 to 1e9")
    limit = parse_duration(a.time_limit) if a.time_limit else None
    return DryRun(a.nodes, a.gpus_per_node, limit,
                  Machine.default(a.assume_latency_us * 1e-6, a.assume_bandwidth * 1e9))


def parse_duration(text: str) -> float:
    """Slurm's time formats (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in seconds."""
    try:
        days, _, rest = text.rpartition("-") if "-" in text else ("0", "", text)
        parts = [int(p) for p in rest.split(":")]
        if "-" in text:
            h, m, s = (parts + [0, 0])[:3]
        else:
            h, m, s = {1: (0, parts[0], 0), 2: (0, *parts), 3: tuple(parts)}[len(parts)]
        total = int(days) * 86400 + h * 3600 + m * 60 + s
    except (ValueError, KeyError):
        raise UsageError(f"malformed time limit {text!r}: expected Slurm's HH:MM:SS, MM or D-HH:MM:SS") from None
    if total <= 0 or min(parts) < 0:
        raise UsageError(f"time limit {text!r} must be positive")
    return float(total)


def hms(seconds: float) -> str:
    seconds = int(math.ceil(seconds))
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def report(est: Estimate, limit_s: float | None, submit: str | None) -> list[str]:
    """The plan's lines: the estimate and, for a time limit, how many allocations of it the job needs and the
    command that runs them one after another (`submit` with {tasks} and {limit} to fill in; None for a job that
    cannot resume, which must fit one allocation)."""
    lines = [f"{est.what}: {est.ranks} ranks, {len(est.visits)} visits; estimated {hms(est.quiet_s)} on a quiet "
             f"machine (CI targets met at the minimum samples), at most {hms(est.worst_s)} (every visit spends its "
             f"budget), launch {hms(est.launch_s)} included"]
    if limit_s is None:
        return lines
    chunks = est.chunks(limit_s)
    if not chunks:
        return lines + [f"time limit {hms(limit_s)}: too short for one visit after the launch; ask for more"]
    if len(chunks) == 1:
        return lines + [f"time limit {hms(limit_s)}: fits in one allocation (worst case {hms(est.worst_s)})"]
    if submit is None:
        return lines + [f"time limit {hms(limit_s)}: too short in the worst case, and the {est.what} does not resume: "
                        f"ask for {hms(est.worst_s / 0.9)}"]
    lines.append(f"time limit {hms(limit_s)}: {len(chunks)} allocations in the worst case, run one after another, "
                 f"each resuming the run directory:")
    lines += [f"  {k + 1:>3}: visits {a + 1}-{b + 1}, {hms(t)}" for k, (a, b, t) in enumerate(chunks)]
    return lines + ["  " + submit.format(tasks=len(chunks) - 1, limit=hms(limit_s))]
