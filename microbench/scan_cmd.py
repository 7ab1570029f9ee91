"""`commcal scan`: every node pair's latency and bandwidth and every node's copy and GEMM rate, and the nodes and
pairs slower than their peers. Run by every rank, one per node; `--dry-run` plans without MPI."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

from microbench import plan
from microbench.atomic import atomic_write_text
from microbench.errors import UsageError
from microbench.flags import Presets, add_quick_argument, add_stop_arguments, check_stop_bounds
from microbench.ops import COMM_DTYPE, OPS, itemsize
from microbench.scanfile import NODE_OPS, ScanConfig
from microbench.schedule import round_count
from microbench.sizes import format_size, parse_size, parse_sizes
from microbench.stats import StopRule
from microbench.switches import infer_levels

MIN_OPERAND = OPS["gemm"].layout(1, 1, itemsize(COMM_DTYPE)).size_bytes
"""The smallest copy or GEMM operand, in bytes: a 2 x 2 matrix (microbench.ops.Op.layout)."""
PRESETS = Presets(defaults=dict(sizes="8,4M", target_ci=0.02, min_samples=10, point_budget=0.5, rounds=1),
                  quick=dict(target_ci=0.05, point_budget=0.2))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", help="scan directory to create (required unless --dry-run)")
    p.add_argument("--sizes", help="ping-pong sizes: the smallest gives each pair's latency, the largest its "
                                   f"bandwidth ({PRESETS.say('sizes')})")
    add_stop_arguments(p, PRESETS, "a pair's size or a node check",
                       "passes over the whole schedule, each with its share of the budget, pooled")
    p.add_argument("--point-budget", type=float,
                   help=f"seconds per pair and size before giving up on the CI target ({PRESETS.say('point_budget')})")
    add_quick_argument(p, "a looser CI target and a shorter budget")
    p.add_argument("--copy-size", default="16M", help=f"each node's copy operand (default 16M; at least {MIN_OPERAND})")
    p.add_argument("--gemm-size", default="1M",
                   help=f"each node's GEMM operand (default 1M: 512 x 512 float32; at least {MIN_OPERAND}: 2 x 2)")
    p.add_argument("--bandwidth-tolerance", type=float, default=0.10,
                   help="flag a pair or node whose bandwidth is this fraction below the reference, or 3 robust "
                        "standard deviations if more (default 0.10)")
    p.add_argument("--latency-tolerance", type=float, default=0.50,
                   help="likewise for latency above the reference (default 0.50)")
    p.add_argument("--node-tolerance", type=float, default=0.25,
                   help="likewise for a node's copy and GEMM rates (default 0.25)")
    p.add_argument("--no-recheck", dest="recheck", action="store_false",
                   help="name what the first measurement flags; by default each flagged pair and node is measured "
                        "once more and keeps the faster of its two figures")
    p.add_argument("--per-rank", action="store_true",
                   help="treat every rank as a node, several to a host allowed (a scan of one machine's ranks)")
    p.add_argument("--timing", choices=("auto", "c", "python"), default="auto",
                   help="timing loop: compiled (built with mpicc) or Python; auto prefers compiled")
    p.add_argument("--expect-world", type=int, help="fail unless the MPI world has this many ranks")
    plan.add_arguments(p, "devices per node (the scan runs one rank per node; this only labels the plan)")


def build_config(args: argparse.Namespace):
    rule = StopRule(target_ci=PRESETS.pick(args, "target_ci"), min_samples=PRESETS.pick(args, "min_samples"),
                    budget_s=PRESETS.pick(args, "point_budget"))
    if not 0 < rule.target_ci < 1 or rule.budget_s <= 0 or rule.min_samples < 6:
        raise UsageError("--target-ci must be in (0, 1), --point-budget positive and --min-samples at least 6")
    sizes = tuple(parse_sizes(PRESETS.pick(args, "sizes")))
    if len(sizes) < 2:
        raise UsageError("--sizes needs two sizes or more: the smallest for latency, the largest for bandwidth")
    rounds = PRESETS.pick(args, "rounds")
    if rounds < 1:
        raise UsageError("--rounds must be 1 or more")
    check_stop_bounds(rule.min_samples, rule.budget_s, rounds)
    for name in ("bandwidth_tolerance", "latency_tolerance", "node_tolerance"):
        if not 0 <= getattr(args, name) < 10:
            raise UsageError(f"--{name.replace('_', '-')} must be between 0 and 10")
    return ScanConfig(sizes, rule, rounds, operand_size("--copy-size", args.copy_size),
                      operand_size("--gemm-size", args.gemm_size), args.recheck)


def operand_size(option: str, text: str) -> int:
    """A node check's operand in bytes: an n x n matrix, n at least 2, so below MIN_OPERAND it would be timed as
    one of MIN_OPERAND bytes, not the size asked for."""
    size = parse_size(text)
    if size < MIN_OPERAND:
        raise UsageError(f"{option} {text}: the operand is an n x n {COMM_DTYPE} matrix, n at least 2, so at least "
                         f"{MIN_OPERAND} bytes")
    return size


def check_nodes(count: int) -> None:
    """A scan measures node pairs: UsageError below two nodes (a dry run refuses what the scan would)."""
    if count < 2:
        raise UsageError("scan needs two nodes or more")


def check_operands(world, hosts: list[str], cfg: ScanConfig) -> None:
    """Refuse, on every rank and before allocating anything, a size or operand whose buffers cannot fit in a rank's
    share of its node's available memory (the fewest over the ranks)."""
    from mpi4py import MPI

    from microbench.sweep import available_memory_bytes, check_fits

    per_rank = world.allreduce(available_memory_bytes() // hosts.count(hosts[world.rank]), op=MPI.MIN)
    for size in cfg.sizes:
        check_fits("pingpong", size, OPS["pingpong"].layout(size, 2, itemsize(COMM_DTYPE)), per_rank)
    for name, size in zip(NODE_OPS, (cfg.copy_size, cfg.gemm_size)):
        check_fits(name, size, OPS[name].layout(size, 1, itemsize(COMM_DTYPE)), per_rank)


def node_names(hosts: list[str], per_rank: bool) -> list[str]:
    """Each rank's node name: its host, or with per_rank 'host:rank'. Refuses two ranks on one host otherwise."""
    if per_rank:
        return [f"{h}:{r}" for r, h in enumerate(hosts)]
    shared = sorted({h for h in hosts if hosts.count(h) > 1})
    if shared:
        raise UsageError(f"scan runs one rank per node, but {', '.join(shared[:3])} hold(s) several: launch with "
                         f"srun --ntasks-per-node=1 (or mpirun --map-by ppr:1:node), or pass --per-rank")
    return list(hosts)


def print_plan(args: argparse.Namespace) -> int:
    """--dry-run: the scan these nodes would run and its estimated time; refused where the scan would be (too few
    nodes, a bad MPI4PY_RC_THREAD_LEVEL)."""
    from microbench.threads import resolve

    resolve(None, "mpi")
    dry = plan.dry_run(args)
    check_nodes(dry.nodes)
    cfg = build_config(args)
    est = plan.scan_estimate(dry.nodes, list(cfg.sizes), cfg.rounds, cfg.rule, dry.machine,
                             (2.0 * cfg.copy_size, 2.0 * (cfg.gemm_size / 4) ** 1.5), cfg.recheck)
    print(f"commcal scan --dry-run: {dry.nodes} nodes ({dry.per_node} device(s) each; one rank per node), "
          f"sizes {','.join(format_size(s) for s in cfg.sizes)}, {cfg.rounds} pass(es) of "
          f"{round_count(dry.nodes)} rounds")
    print("\n".join(plan.report(est, dry.limit_s, None)))
    return 0


def run(args: argparse.Namespace) -> int:
    from microbench.sweep_cmd import check_expect_world, check_world

    check_expect_world(args.expect_world)
    if plan.dry(args):
        return print_plan(args)
    cfg = build_config(args)
    from microbench.threads import choose, record
    threads = choose(None, "mpi")
    from mpi4py import MPI

    from microbench import memcopy, provenance, scan
    from microbench.backends import backend_for
    from microbench.buffers import set_page_policy
    from microbench.scanfile import SCAN_SCHEMA, SCAN_SCHEMA_VERSION, Recheck, Scan, read_scan, rows_frame, write_scan

    world = MPI.COMM_WORLD
    check_world(world.size, args.expect_world)
    hosts = world.allgather(MPI.Get_processor_name())
    nodes = node_names(hosts, args.per_rank)
    check_nodes(world.size)
    check_operands(world, hosts, cfg)
    out = Path(args.out)
    if world.rank == 0 and (out / "scan.json").exists():
        error = f"{out} already holds a scan; choose another --out"
    else:
        error = None
    if error := world.bcast(error, root=0):
        raise UsageError(error)
    backend = backend_for("mpi", world, hosts)
    page_policy = set_page_policy("nohugepage")
    timer, timing_note = backend.make_timer(world, args.timing)
    say = (lambda line: print(f"commcal scan: {line}", flush=True)) if world.rank == 0 else None
    if say:
        say(f"{len(nodes)} nodes, {round_count(len(nodes))} rounds of up to {len(nodes) // 2} pairs at once, "
            f"sizes {','.join(format_size(s) for s in cfg.sizes)}, timing: {timing_note}")
    counters = provenance.cpu_counters()
    rows = scan.measure_pairs(world, nodes, cfg, timer, backend, say)
    rows += scan.measure_nodes(world, nodes, cfg, backend)
    options = dict(sizes=list(cfg.sizes), target_ci=cfg.rule.target_ci, min_samples=cfg.rule.min_samples,
                   point_budget_s=cfg.rule.budget_s, rounds=cfg.rounds, copy_size=cfg.copy_size,
                   gemm_size=cfg.gemm_size, per_rank=args.per_rank, recheck=cfg.recheck,
                   bandwidth_tolerance=args.bandwidth_tolerance, latency_tolerance=args.latency_tolerance,
                   node_tolerance=args.node_tolerance)
    rechecked: list[Recheck] = []
    if cfg.recheck:
        suspects = world.bcast(Scan(out, dict(nodes=nodes, options=options), rows_frame(rows)).suspects()
                               if world.rank == 0 else None, root=0)
        if suspects:
            rows, rechecked = scan.recheck(world, nodes, cfg, timer, backend, rows, suspects, say)
    steal = provenance.host_steal(world, hosts, counters)
    if world.rank != 0:
        return 0
    meta = provenance.run_metadata(
        None, hosts, mpi_library=provenance.mpi_library_version(), mpi_standard=".".join(map(str, MPI.Get_version())),
        backend="mpi", backend_versions={}, gpus=[], page_policy=page_policy, timing_path=timer.path,
        timing_note=timing_note, options=options)
    meta.update(schema=SCAN_SCHEMA, version=SCAN_SCHEMA_VERSION, nodes=nodes, end_time=provenance.now(),
                cpu_steal=steal, memcpy_alias_slowdown=round(memcopy.alias_slowdown(), 2),
                mpi_thread_level=record(threads), rechecked=[asdict(r) for r in rechecked])
    out.mkdir(parents=True, exist_ok=True)
    write_scan(out, meta, rows)
    print("\n".join(scan.summary_lines(rows)), flush=True)
    for r in rechecked:
        print(f"commcal scan: rechecked {r.op} {r.node_a + ('-' + r.node_b if r.node_b else '')} "
              f"{format_size(r.size_bytes)}: {r.first_s * 1e6:.2f}us then {r.second_s * 1e6:.2f}us, kept the "
              f"{'second' if r.kept_second else 'first'}", flush=True)
    found = read_scan(out)
    for v in found.verdicts():
        print(f"commcal scan: {v.metric}: reference {v.reference:.4g}, allowed {v.threshold:.3g} worse; slow nodes: "
              f"{', '.join(v.slow_nodes) or 'none'}"
              + (f"; slow pairs: {', '.join(f'{a}-{b}' for a, b in v.slow_pairs) or 'none'}"
                 if v.metric in ("bandwidth", "latency") else ""), flush=True)
    flagged = found.flagged_nodes()
    print(f"commcal scan: flagged nodes: "
          + (", ".join(f"{n} ({', '.join(m)})" for n, m in flagged.items()) or "none")
          + f"; results in {out}", flush=True)
    inferred = infer_levels(found.pair_values(found.bandwidth_size, "rate"), found.nodes)
    if inferred.why:
        print(f"commcal scan: no switch levels inferred: {inferred.why}", flush=True)
    else:
        atomic_write_text(out / "topology.conf", inferred.conf())
        print(f"commcal scan: inferred {len(inferred.topology.levels)} switch levels (leaf groups: "
              f"{' | '.join(','.join(g) for g in inferred.topology.levels[0])}); for the sweep: "
              f"--topology {out / 'topology.conf'}", flush=True)
    wrong = sum(r.wrong for r in rows)
    if wrong:
        print(f"commcal: error: {wrong} wrong result elements in the scan", file=sys.stderr, flush=True)
    return 1 if wrong else 0
