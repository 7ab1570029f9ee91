"""`commcal sweep`: arguments, preflight checks, provenance, and the exit code. Run by every rank."""

from __future__ import annotations

import argparse
import os
import sys

from microbench import plan, records
from microbench.backends import backend_for
from microbench.buffers import CACHE_MODES, PAGE_POLICIES, set_page_policy
from microbench.errors import UsageError
from microbench.flags import Presets, add_backend_argument, add_quick_argument, add_stop_arguments, check_stop_bounds
from microbench.limits import MAX_GEMM, MAX_RANKS
from microbench.methods import METHODS, method_for
from microbench.ops import LOCAL_OPS, OPS, parse_ops
from microbench.sizes import parse_sizes
from microbench.stats import StopRule
from microbench.switches import Topology, discover, read_topology
from microbench.threads import LEVELS, choose, record, resolve
from microbench.topology import parse_links, parse_procs

DEFAULT_SIZES = "8:64M,1448,2896,5792,11584,23168,46344"
"""The powers of two from 8 B to 64 MiB, and between 1 and 64 KiB, where MPI transports change protocol (eager and
shared-memory copy limits), the geometric middles too: a regime between two powers of two then holds the three sizes a
fit segment needs (docs/results.md, "Sizes between the grid's points")."""

PRESETS = Presets(
    defaults=dict(sizes=DEFAULT_SIZES, gemm_sizes="64K,1M,16M", target_ci=0.02, min_samples=10, point_budget=1.0, rounds=3,
                  bisect=2),
    quick=dict(sizes="8,64,512,4K,32K,128K,512K,2M,8M", gemm_sizes="64K,1M", target_ci=0.05, point_budget=0.25,
               bisect=0))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", help="run directory (created; see --resume); required unless --dry-run")
    p.add_argument("--ops", help=f"comma-separated subset of: {', '.join(OPS)} (default: all)")
    p.add_argument("--sizes", help="comma-separated sizes and LOW:HIGH ranges (every power of two between), K/M/G "
                                   f"suffixes, e.g. 8,1K,3M or 1K:1M,1536 ({PRESETS.say('sizes')})")
    p.add_argument("--gemm-sizes", help=f"operand sizes for gemm and copy ({PRESETS.say('gemm_sizes')})")
    p.add_argument("--procs", help="process counts, e.g. 2,4,8 (default: powers of two up to the world, and the world)")
    p.add_argument("--links", help="link classes to measure: intra, inter, inter2..inter9 (switch levels), spread "
                                   "(default: all the job can form)")
    p.add_argument("--topology", metavar="FILE",
                   help="the switch tree, in Slurm's topology.conf syntax (SwitchName=S Nodes=... / Switches=...): "
                        "each switch level becomes a link class (default: inside a Slurm job, `scontrol show "
                        "topology`; else flat, every node pair one 'inter' level)")
    add_stop_arguments(p, PRESETS, "a point", "visit every point this many times, in passes over the whole sweep, "
                       "each with its share of the point budget, and pool the samples: one contiguous window on a "
                       "shared machine gives a median that another window does not reproduce")
    p.add_argument("--point-budget", type=float,
                   help=f"seconds per point before giving up on the CI target ({PRESETS.say('point_budget')})")
    p.add_argument("--bisect", type=int, metavar="N",
                   help="after the rounds, measure the geometric middle of every interval between adjacent sizes "
                        "where the time grew faster than the size beyond the CIs and by over 5%% (a protocol or "
                        "algorithm change no alpha-beta line through the two holds), as many rounds; then again inside "
                        f"the half that holds the change, up to N passes in all ({PRESETS.say('bisect')}; 0 turns it "
                        "off; communication only, never in a reference --method)")
    p.add_argument("--held-out", metavar="SIZES",
                   help="more sizes to measure as the others, which --bisect never looks at: to check a fit at "
                        "sizes it never saw (fit a copy of the run without them)")
    p.add_argument("--retries", type=int, default=1,
                   help="measure points whose CI missed the target again at the end of the sweep, up to this many "
                        "times, pooling each extra visit with the others (default 1; 0 turns it off)")
    p.add_argument("--concurrent", action="store_true",
                   help="measure every disjoint group of a shape at once (as all groups of a mesh axis run in "
                        "training) instead of one group while the other ranks wait")
    add_quick_argument(p, "a preset that finishes in under a minute on 2 local ranks, for trying commcal out: "
                       "calibrations from it rank strategies worse, and validate says so")
    p.add_argument("--resume", action="store_true", help="finish the missing points of an earlier run in --out")
    add_backend_argument(p)
    p.add_argument("--timing", choices=("auto", "c", "python"), default="auto",
                   help="timing loop: compiled (built with mpicc) or Python; auto prefers compiled")
    p.add_argument("--page-policy", choices=PAGE_POLICIES, default="nohugepage",
                   help="huge pages for numpy buffers (default nohugepage: buffers like a C program's malloc, "
                        "so figures compare with OSU/IMB; hugepage is what numpy-based applications get)")
    p.add_argument("--cache", choices=CACHE_MODES,
                   help="cold (default): iterations rotate through copies of their buffers spanning 64 MiB, so each "
                        "call (collective, gemm or copy) finds them out of cache, as a step of training does; "
                        "warm: one pair reused, the back-to-back figure most benchmarks report (and what every "
                        "--method other than commcal uses)")
    p.add_argument("--method", choices=tuple(METHODS), default="commcal",
                   help="commcal (default): each call after a barrier, max over ranks, median with a CI; osu, "
                        "osu-window (osu_bw, pingpong only), imb, nccl-tests: a reference mode that times as that "
                        "peer does, in its size convention, to reproduce its table (docs/peers.md)")
    p.add_argument("--thread-level", choices=LEVELS,
                   help="the MPI thread level to ask for (default: MPI4PY_RC_THREAD_LEVEL if set, else the lowest "
                        "the work needs: single; funneled for the GPU backends)")
    p.add_argument("--gap-ms", type=float, default=0.0,
                   help="idle milliseconds before each timed call's barrier (default 0: back to back). In training a "
                        "collective follows compute; on a machine whose collectives run slower after a pause, a gap "
                        "measures them after such a pause (opt-in; see docs/results.md for what it did to "
                        "validate's ranking)")
    p.add_argument("--after-gemm", type=int, default=0, metavar="N",
                   help="before each timed collective, every rank measured at once runs an N x N float32 GEMM "
                        "between two barriers, as collectives follow compute in a training step (default 0: "
                        "back to back; gemm and copy are left out, measured by the sweep without it; opt-in; see "
                        "docs/results.md for what it did to validate's ranking)")
    p.add_argument("--in-place", action="store_true",
                   help="nccl backend: measure allreduce, allgather and reduce_scatter in place")
    p.add_argument("--expect-world", type=int, help="fail unless the MPI world has this many ranks")
    plan.add_arguments(p, "ranks per node, one per device")


def build_config(args: argparse.Namespace, world_size: int, dtypes: dict[str, tuple[str, ...]],
                 topology: Topology | None = None):
    """The sweep configuration from arguments (quick preset first, explicit flags override it); `topology`: the
    job's switch levels (None: not known yet, so --links is not held against them; flat in the result)."""
    from microbench.sweep import SweepConfig

    def pick(name: str):
        return PRESETS.pick(args, name)

    rule = StopRule(target_ci=pick("target_ci"), min_samples=pick("min_samples"), budget_s=pick("point_budget"))
    if not 0 < rule.target_ci < 1:
        raise UsageError(f"--target-ci must be between 0 and 1, not {rule.target_ci}")
    if rule.budget_s <= 0:
        raise UsageError("--point-budget must be positive")
    if rule.min_samples < 6:
        raise UsageError("--min-samples must be at least 6, the fewest samples that give a 95% CI of the median")
    if args.retries < 0:
        raise UsageError("--retries must be 0 or more")
    if not 0 <= args.gap_ms <= 1000:
        raise UsageError(f"--gap-ms must be between 0 and 1000, not {args.gap_ms:g}")
    if not 0 <= args.after_gemm <= MAX_GEMM:
        raise UsageError(f"--after-gemm must be between 0 and {MAX_GEMM}, not {args.after_gemm}")
    rounds = pick("rounds")
    if rounds < 1:
        raise UsageError("--rounds must be 1 or more")
    check_stop_bounds(rule.min_samples, rule.budget_s, rounds, args.retries)
    ops, cache = measured_ops(args)
    bisect = pick("bisect")
    if bisect < 0:
        raise UsageError("--bisect must be 0 or more")
    if method_for(args.method).reference:
        if args.bisect:
            raise UsageError(f"--method {args.method} reproduces the peer's table at its sizes: drop --bisect")
        bisect = 0
    return SweepConfig(ops=ops, method=args.method, sizes=tuple(parse_sizes(pick("sizes"))),
                       procs=tuple(parse_procs(args.procs, world_size)),
                       links=tuple(parse_links(args.links, topology and topology.height)),
                       topology=topology or Topology(),
                       rule=rule, backend=args.backend, in_place=args.in_place, dtypes=dtypes, retries=args.retries,
                       concurrent=args.concurrent, rounds=rounds, cache=cache, gap_ms=args.gap_ms,
                       after_gemm=args.after_gemm, bisect=bisect,
                       held_out=tuple(parse_sizes(args.held_out)) if args.held_out else (),
                       gemm_sizes=tuple(parse_sizes(pick("gemm_sizes"))))


def measured_ops(args: argparse.Namespace) -> tuple[tuple, str]:
    """(operations, buffer cache mode) for --method and --after-gemm. A reference mode times communication only,
    back to back on warm buffers, so its default operations are the peers' (no gemm or copy) and it refuses the
    conditions that would make it commcal's method again. With --after-gemm the local operations are left out: a
    GEMM before them changes none of the after-compute models, and the main sweep measures them."""
    method = method_for(args.method, [op.name for op in parse_ops(args.ops)] if args.ops else ())
    if not method.reference:
        ops = tuple(parse_ops(args.ops))
        if not args.after_gemm:
            return ops, args.cache or "cold"
        comm = tuple(op for op in ops if op.name not in LOCAL_OPS)
        if not comm:
            raise UsageError(f"--after-gemm times collectives after a GEMM and --ops names none "
                             f"({', '.join(op.name for op in ops)}: measure them in a sweep without --after-gemm)")
        return comm, args.cache or "cold"
    if args.cache == "cold" or args.gap_ms or args.after_gemm or args.concurrent or args.in_place:
        raise UsageError(f"--method {method.name} times the peer's way, back to back on warm buffers: drop --cache "
                         f"cold, --gap-ms, --after-gemm, --concurrent and --in-place")
    if not args.ops:
        names = ["pingpong"] if method.name == "osu-window" else \
            [name for name, op in OPS.items() if op.kind != "compute" and name != "sendrecv"]
        return tuple(parse_ops(",".join(names))), "warm"
    local = [op.name for op in parse_ops(args.ops) if op.name in LOCAL_OPS]
    if local:
        raise UsageError(f"--method {method.name} measures communication only, not {', '.join(local)}")
    return tuple(parse_ops(args.ops)), "warm"


def launcher_task_count() -> int | None:
    """Ranks the launcher meant to start when it is Slurm's srun itself (mpirun/mpiexec start their own)."""
    if "PRTE_LAUNCHED" in os.environ or "HYDI_CONTROL_FD" in os.environ:
        return None
    for var in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"):
        if os.environ.get(var, "").isdecimal():
            return int(os.environ[var])
    return None


def check_expect_world(expect: int | None) -> None:
    """--expect-world's range, checked before MPI starts: a world has 1 to MAX_RANKS ranks."""
    if expect is not None and not 1 <= expect <= MAX_RANKS:
        raise UsageError(f"--expect-world must be 1 to {MAX_RANKS}, not {expect}")


def check_world(world_size: int, expect: int | None) -> None:
    if expect is not None and world_size != expect:
        raise UsageError(f"MPI world has {world_size} ranks but --expect-world is {expect}")
    tasks = launcher_task_count()
    if tasks is not None and tasks != world_size:
        raise UsageError(f"MPI world has {world_size} ranks but Slurm started {tasks} tasks: the MPI library is not "
                         f"talking to Slurm's PMI (with Open MPI use srun --mpi=pmix, or mpirun in the allocation)")


def check_resume(earlier: dict | None, conditions: dict, pages: str) -> None:
    """A resumed run keeps the conditions its calls were timed in (records.conditions) and its buffers' huge-page
    advice (`pages`: set_page_policy's answer now): its points would not pool with calls timed otherwise."""
    had = records.conditions(earlier.get("options", {})) if earlier else conditions
    now = conditions | {"page_policy": records.page_advice(pages)}
    if earlier:
        had = had | {"method": records.timing_method(earlier)}
    if earlier and (advice := records.page_advice(earlier.get("page_policy"))):
        had = had | {"page_policy": advice}
    for name, value in had.items():
        if value != now[name]:
            show = lambda v: f"{v:g}" if isinstance(v, float) else v  # noqa: E731
            raise UsageError(f"--resume: the run was measured with --{name.replace('_', '-')} {show(value)}, not "
                             f"{show(now[name])}; its points would not pool with these")


def print_plan(args: argparse.Namespace) -> int:
    """--dry-run: the sweep this allocation would measure (sweep.plan on its shape, MPI left uninitialised), its
    estimated time, and how it splits into allocations of --time-limit. The thread level is checked as the sweep
    would check it (before mpi4py reads MPI4PY_RC_THREAD_LEVEL and warns of a bad one)."""
    resolve(args.thread_level, args.backend)
    dry = plan.dry_run(args)
    world = dry.nodes * dry.per_node
    nodes, topology = _dry_nodes(args.topology, dry.nodes)
    cfg = build_config(args, world, {}, topology)
    import mpi4py

    mpi4py.rc.initialize = mpi4py.rc.finalize = False
    from microbench import sweep

    points = sweep.plan(cfg, [node for node in nodes for _ in range(dry.per_node)])
    est = plan.sweep_estimate(points, cfg.rounds, cfg.retries, cfg.rule, dry.machine, world)
    print(f"commcal sweep --dry-run: {dry.nodes} nodes x {dry.per_node} ranks, {len(points)} points "
          f"({len(cfg.ops)} operations, {len(cfg.sizes)} sizes, process counts {','.join(map(str, cfg.procs))}, "
          f"links {','.join(cfg.links)}), {cfg.rounds} rounds, {cfg.retries} retries, point budget {cfg.rule.budget_s:g} s"
          + (f"; up to {cfg.bisect} bisection passes, not counted: one point each per interval where a regime change "
             f"shows" if cfg.bisect else ""))
    print("\n".join(plan.report(est, dry.limit_s, f"sbatch --array=0-{{tasks}}%1 -N {dry.nodes} --ntasks-per-node="
                                 f"{dry.per_node} -t {{limit}} slurm/sweep.sh   (one task at a time, each resuming)")))
    return 0


def _dry_nodes(path: str | None, count: int) -> tuple[list[str], Topology]:
    """The dry run's nodes and their switch levels: the first `count` nodes --topology's file names, in its order;
    without a file, `count` made-up names on a flat network."""
    if not path:
        return [f"node{i}" for i in range(count)], Topology()
    topology = read_topology(path)
    if count > len(topology.nodes):
        raise UsageError(f"--nodes {count}: the topology ({path}) names only {len(topology.nodes)} nodes")
    named = list(topology.nodes[:count])
    return named, topology.restrict(named)


def _topology(path: str | None, hosts: list[str]) -> Topology | str:
    """The job's switch levels (switches.discover, restricted to its nodes), or the one-line error."""
    try:
        return discover(path).restrict(hosts)
    except UsageError as exc:
        return str(exc)


def run(args: argparse.Namespace) -> int:
    check_expect_world(args.expect_world)
    if plan.dry(args):
        return print_plan(args)
    threads = choose(args.thread_level, args.backend)      # before MPI is initialised
    from mpi4py import MPI

    from microbench import memcopy, provenance, sweep
    from microbench.store import RunStore

    world = MPI.COMM_WORLD
    check_world(world.size, args.expect_world)
    if args.in_place and args.backend != "nccl":
        raise UsageError("--in-place applies to --backend nccl")
    build_config(args, world.size, {})             # reject bad arguments before touching a device or the topology
    hosts = world.allgather(MPI.Get_processor_name())
    topology = world.bcast(_topology(args.topology, hosts) if world.rank == 0 else None, root=0)
    if isinstance(topology, str):
        raise UsageError(topology)
    backend = backend_for(args.backend, world, hosts)
    cfg = build_config(args, world.size, {op.name: backend.dtypes(op) for op in parse_ops(args.ops) if op.local},
                       topology)
    points = sweep.plan(cfg, hosts)
    if not points:
        raise UsageError("nothing to measure: no link class in --links can be formed with these process counts")
    ranks_here = hosts.count(hosts[world.rank])
    per_rank = world.allreduce(sweep.available_memory_bytes() // ranks_here, op=MPI.MIN)
    sweep.check_memory(points, per_rank, cfg.cache)

    conditions = records.conditions(vars(cfg)) | {"method": cfg.method}
    page_policy = set_page_policy(args.page_policy)
    store = RunStore(args.out)
    error = None
    if world.rank == 0:
        try:
            earlier = store.prepare(args.resume)
            done = store.visits_done()
            check_resume(earlier, conditions, page_policy)
        except UsageError as exc:
            error, earlier, done = str(exc), None, {}
        try:
            bisected = store.bisected()
        except UsageError as exc:
            error, bisected = error or str(exc), (0, {})
    else:
        bisected = None
    error = world.bcast(error, root=0)
    if error:
        raise UsageError(error)
    passes, extra = world.bcast(bisected, root=0)
    points = sweep.plan(cfg, hosts, extra)          # with the sizes earlier launches bisected at
    timer, timing_note = backend.make_timer(world, args.timing)
    gpus = backend.devices(world)                  # collective: every rank reports its device
    sharing = provenance.cpu_sharing(world)
    if world.rank == 0:
        slowdown = memcopy.alias_slowdown()
        meta = provenance.run_metadata(
            earlier, hosts, mpi_library=provenance.mpi_library_version(),
            mpi_standard=".".join(map(str, MPI.Get_version())), backend=cfg.backend,
            backend_versions=backend.versions(), gpus=gpus, page_policy=page_policy, timing_path=timer.path,
            timing_note=timing_note,
            options=dict(ops=[op.name for op in cfg.ops], sizes=list(cfg.sizes), procs=list(cfg.procs),
                         links=list(cfg.links), gemm_sizes=list(cfg.gemm_sizes), target_ci=cfg.rule.target_ci,
                         min_samples=cfg.rule.min_samples, point_budget_s=cfg.rule.budget_s, retries=cfg.retries,
                         rounds=cfg.rounds, bisect=cfg.bisect, held_out=list(cfg.held_out),
                         concurrent=cfg.concurrent, quick=args.quick, in_place=cfg.in_place, **conditions))
        meta["memcpy_alias_slowdown"] = round(slowdown, 2)
        meta["topology"] = topology.to_json()
        meta["mpi_thread_level"] = record(threads)
        meta["cpu_sharing"] = sharing
        run_id, launch = meta["run_id"], len(meta["resumed_at"])
        left_out = [op.name for op in parse_ops(args.ops) if op not in cfg.ops] if cfg.after_gemm else []
        store.start(meta)
        finished = sum(done.get(pt.key.point_id, 0) >= cfg.rounds for pt in points)
        partly = sum(0 < done.get(pt.key.point_id, 0) < cfg.rounds for pt in points)
        print(f"commcal sweep: {len(points)} points ({finished} already done, {partly} partly), {cfg.rounds} rounds, "
              f"{world.size} ranks on {len(set(hosts))} node(s), timing: {timing_note}, pages: {page_policy}, "
              f"{cfg.cache} buffers, method {cfg.method}, MPI thread level {meta['mpi_thread_level']['provided']}"
              + (f", {conditions['gap_ms']:g} ms gap before each call" if cfg.gap_ms else "")
              + (f", a {cfg.after_gemm}x{cfg.after_gemm} GEMM before each collective" if cfg.after_gemm else "")
              + (f" ({', '.join(left_out)} left out: measured by a sweep without --after-gemm)" if left_out else ""),
              flush=True)
        if warning := memcopy.advice(slowdown):
            print(f"warning: {warning}", flush=True)
        if sharing:
            print(f"warning: {provenance.sharing_text(sharing)}", flush=True)
    else:
        run_id, done, launch = None, {}, 0
    run_id, done, launch = world.bcast((run_id, done, launch), root=0)
    counters = provenance.cpu_counters()
    wrong = sweep.run_points(world, points, done, cfg, run_id, timer, store, backend, launch, passes)
    steal = provenance.host_steal(world, hosts, counters)
    if world.rank == 0:
        store.consolidate()
        store.write_run(meta | {"end_time": provenance.now(), "cpu_steal": steal})
        print(f"commcal sweep: done, results in {args.out}; CPU time taken by the hypervisor (steal): "
              f"{provenance.steal_text(steal)}", flush=True)
        if wrong:
            print(f"commcal: error: {wrong} wrong result elements (see the 'wrong' column of {args.out}/summary.csv)",
                  file=sys.stderr, flush=True)
    return 1 if wrong else 0
