"""Benchmark: commcal beside the OSU Micro-Benchmarks 7.5 and IMB 2021.11, with their own binaries.

Run as one plain process (it starts every mpirun job itself): `python -m benchmarks.peers [--reps 3]`.
It builds OSU and IMB from ../shared/peers/*.tar.gz (or $COMMCAL_PEERS_DIR) with the MPI's own mpicc in a temporary
directory, keeps the binaries under ~/.cache/commcal/peers (so repeats start at once; their code is never part of
this repository), and skips a peer with its reason where its sources or a compiler are absent or the build fails.
Then, `--reps` times: per operation, each peer's binary followed at once by the commcal reference mode that
reproduces it (`sweep --method osu|osu-window|imb`), so drift on a shared machine falls on both alike; then
commcal's default method (cold buffers, and `--cache warm` at thread levels single and multiple) and a standalone
C program timing ping-pong and allreduce as the default method does (benchmarks/ref_main.c, MPI_THREAD_SINGLE), on
warm buffers and on the default's cold pool. Every job runs under MPI's defaults (Launcher.DROPPED). It prints,
per operation and size (the peers' convention: allgather and alltoall sizes per rank), the medians over the
repetitions and the ratios commcal/peer for the reference and the default modes (the default at the same
whole-buffer size), then the default method against the C loop, then the ping-pong decomposition of the default
mode's gap to OSU (thread level, cold buffers, per-call barrier and max over ranks). Ping-pong, osu_bw and the C
loop run on 2 ranks (`--launch`), the collectives on `--group-launch`'s ranks where given (e.g. 2 nodes x 2).
Targets (issue 33): reference mode within 5% of OSU at every size for every shared op; default mode at 8 B within
1.10x of the C loop timing the same way."""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from calib.peers import imb, osu
from calib.peers.model import Job
from microbench import cloop
from microbench.methods import METHODS
from microbench.records import load_summary
from microbench.sizes import format_size, parse_sizes
from benchmarks import benchmark_parser

REPO = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
OPS = ("pingpong", "bw", "allreduce", "allgather", "alltoall", "bcast", "reduce", "reduce_scatter")
OSU_BINARIES = {"pingpong": "osu_latency", "bw": "osu_bw", "allreduce": "osu_allreduce",
                "allgather": "osu_allgather", "alltoall": "osu_alltoall", "bcast": "osu_bcast", "reduce": "osu_reduce",
                "reduce_scatter": "osu_reduce_scatter"}
OSU_DIRS = ("c/mpi/pt2pt/standard", "c/mpi/collective/blocking")
IMB_NAMES = {"pingpong": "PingPong", "allreduce": "Allreduce", "allgather": "Allgather", "alltoall": "Alltoall",
             "bcast": "Bcast", "reduce": "Reduce", "reduce_scatter": "Reduce_scatter"}
SWEEP = ["--rounds", "1", "--retries", "0", "--point-budget", "0.3", "--min-samples", "8", "--target-ci", "0.02"]
"""Stopping settings of every commcal run here (the method is what the comparison is about, not the budget)."""
COLLECTIVES = ("allreduce", "allgather", "alltoall", "bcast", "reduce", "reduce_scatter")
PAIR_OPS = ("pingpong", "bw")


def peers_dir() -> Path:
    return Path(os.environ.get("COMMCAL_PEERS_DIR") or REPO.parent / "shared" / "peers")


def _key(tar: Path, mpicc: str) -> str:
    return hashlib.sha256(tar.read_bytes() + mpicc.encode()).hexdigest()[:12]


def _run_build(argv: list[str], cwd: Path, env: dict) -> None:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [str(proc.returncode)]
        raise RuntimeError(f"{' '.join(argv[:2])} failed: {tail[0]}")


def build(peer: str, mpicc: str) -> tuple[Path | None, str]:
    """(directory of the peer's binaries, a note): built once per tarball and compiler into the cache; None and the
    reason where the sources are absent or the build fails."""
    pattern = {"osu": "osu-micro-benchmarks-7.5*.tar.gz", "imb": "intel-mpi-benchmarks-2021.11*.tar.gz"}[peer]
    tars = sorted(peers_dir().glob(pattern))
    if not tars:
        return None, f"no {pattern} in {peers_dir()}"
    dest = cloop.cache_dir() / "peers" / f"{peer}-{_key(tars[0], mpicc)}"
    wanted = list(OSU_BINARIES.values()) if peer == "osu" else ["IMB-MPI1"]
    if all((dest / b).is_file() for b in wanted):
        return dest, f"cached {dest}"
    bindir = Path(mpicc).parent
    env = dict(os.environ, CC=mpicc, CXX=str(bindir / "mpicxx"), PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    try:
        with tempfile.TemporaryDirectory(prefix=f"commcal-{peer}-") as tmp:
            with tarfile.open(tars[0]) as tf:
                tf.extractall(tmp, filter="data")
            top = Path(tmp)   # IMB's tarball has no top directory, OSU's has one
            src = top if (top / "Makefile").is_file() else next(p for p in top.iterdir() if p.is_dir())
            if peer == "osu":
                _run_build(["./configure", f"CC={mpicc}", f"CXX={env['CXX']}"], src, env)
                _run_build(["make", "-j2"], src, env)
                found = {b: next((src / d / b for d in OSU_DIRS if (src / d / b).is_file()), None) for b in wanted}
            else:
                _run_build(["make", "IMB-MPI1", f"CC={mpicc}", f"CXX={env['CXX']}"], src, env)
                found = {"IMB-MPI1": next((p for p in src.rglob("IMB-MPI1") if p.is_file()), None)}
            missing = [b for b, p in found.items() if p is None]
            if missing:
                return None, f"build made no {', '.join(missing)}"
            staging = dest.with_name(dest.name + ".tmp")
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            for b, p in found.items():
                shutil.copy2(p, staging / b)
            shutil.rmtree(dest, ignore_errors=True)
            staging.rename(dest)
    except (OSError, RuntimeError, subprocess.TimeoutExpired, tarfile.TarError) as exc:
        return None, f"build failed: {exc}"
    return dest, f"built into {dest}"


def build_reference(mpicc: str) -> Path:
    """benchmarks/ref_main.c (with ref_loop.c) as a program of its own, cached like the peers."""
    key = hashlib.sha256((HERE / "ref_main.c").read_bytes() + (HERE / "ref_loop.c").read_bytes()
                         + mpicc.encode()).hexdigest()[:12]
    exe = cloop.cache_dir() / "peers" / f"ref_main-{key}"
    if not exe.is_file():
        exe.parent.mkdir(parents=True, exist_ok=True)
        _run_build([mpicc, "-O2", "-o", str(exe), str(HERE / "ref_main.c")], HERE, dict(os.environ))
    return exe


class Launcher:
    """Runs an MPI job of `ranks` ranks: local mpirun (unbound), or a given launcher prefix (e.g. across two nodes).
    Every tool runs under MPI's defaults: the variables that change how ranks wait or what thread level mpi4py asks
    for are dropped (commcal picks its own thread level; the peers run at theirs)."""

    DROPPED = ("MPI4PY_RC_THREAD_LEVEL", "OMPI_MCA_mpi_yield_when_idle")

    def __init__(self, mpicc: str, launch: str | None = None, ranks: int = 2) -> None:
        mpirun = shutil.which("mpirun", path=str(Path(mpicc).parent)) or shutil.which("mpirun")
        self.ranks = ranks
        self.prefix = shlex.split(launch) if launch else [mpirun, "-n", str(ranks), "--oversubscribe",
                                                          "--bind-to", "none"]
        self.env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                        PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        for name in self.DROPPED:
            self.env.pop(name, None)

    def run(self, argv: list[str], timeout: float = 900) -> str:
        proc = subprocess.run([*self.prefix, *argv], env=self.env,
                              capture_output=True, text=True, timeout=timeout, cwd=REPO)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:6])} exited {proc.returncode}: {proc.stderr.strip()[-400:]}")
        return proc.stdout


Table = dict[tuple[str, int], float]
"""(op, size in commcal's convention) -> seconds."""


@dataclass(frozen=True)
class Jobs:
    """The two launchers of a comparison: `pair` (2 ranks) for ping-pong, osu_bw and the C loop, `group` for the
    collectives (the same 2 ranks locally; e.g. 2 nodes x 2 ranks across the local cluster)."""

    pair: Launcher
    group: Launcher

    def of(self, op: str) -> Launcher:
        return self.pair if op in PAIR_OPS else self.group


def run_osu(jobs: Jobs, bindir: Path, op: str, sizes: list[int]) -> Table:
    launch = jobs.of(op)
    text = launch.run([str(bindir / OSU_BINARIES[op]), "-m", f"{min(sizes)}:{max(sizes)}"])
    log = osu.read_text(Path(OSU_BINARIES[op]), text, Job(world=launch.ranks))
    return {(op, p.size_bytes): p.seconds for p in log.points}


def run_imb(jobs: Jobs, bindir: Path, op: str, sizes: list[int]) -> Table:
    launch = jobs.of(op)
    lo, hi = min(sizes).bit_length() - 1, max(sizes).bit_length() - 1
    text = launch.run([str(bindir / "IMB-MPI1"), "-npmin", str(launch.ranks), "-msglog", f"{lo}:{hi}",
                       IMB_NAMES[op]])
    return {(p.op, p.size_bytes): p.seconds
            for p in imb.read_text(Path("IMB-MPI1"), text, Job(world=launch.ranks)).points}


def run_sweep(launch: Launcher, tmp: Path, name: str, sizes: list[int], ops: str, *extra: str, key: str = "") -> Table:
    """commcal's medians over the job's whole world (one group of all its ranks)."""
    out = tmp / name
    shutil.rmtree(out, ignore_errors=True)
    launch.run([sys.executable, "-m", "reports.cli", "sweep", "--out", str(out), "--ops", ops,
                "--procs", str(launch.ranks), "--sizes", ",".join(map(str, sizes)), *SWEEP, *extra])
    s = load_summary(out)
    return {(key or op, int(size)): float(t) for op, size, t in zip(s["op"], s["size_bytes"], s["median_s"])}


def run_references(jobs: Jobs, bins: dict, tmp: Path, sizes: list[int], rep: int) -> dict[str, Table]:
    """Per operation, each peer's binary followed at once by commcal's mode that reproduces it (so drift on a shared
    machine falls on both alike), then OSU's binary again, whose ratio to its first run is the machine's noise
    ceiling for the comparison: "osu", "commcal-osu", "osu-repeat", "imb", "commcal-imb"."""
    out: dict[str, Table] = {}
    for op in OPS:
        launch, mode = jobs.of(op), "pingpong" if op == "bw" else op
        if bins.get("osu"):
            out.setdefault("osu", {}).update(run_osu(jobs, bins["osu"], op, sizes))
            method = "osu-window" if op == "bw" else "osu"
            out.setdefault("commcal-osu", {}).update(
                run_sweep(launch, tmp, f"osu-{op}-{rep}", sizes, mode, "--method", method, key=op))
            out.setdefault("osu-repeat", {}).update(run_osu(jobs, bins["osu"], op, sizes))
        if bins.get("imb") and op in IMB_NAMES:
            out.setdefault("imb", {}).update(run_imb(jobs, bins["imb"], op, sizes))
            out.setdefault("commcal-imb", {}).update(
                run_sweep(launch, tmp, f"imb-{op}-{rep}", sizes, mode, "--method", "imb"))
    return out


def run_defaults(jobs: Jobs, tmp: Path, sizes: list[int], rep: int) -> dict[str, Table]:
    """commcal's default method, cold and warm (and warm at MPI_THREAD_MULTIPLE for ping-pong and allreduce), at the
    whole-buffer sizes of the peers' (allgather, alltoall and reduce_scatter also at the group's blocks)."""
    group, pair = jobs.group, jobs.pair
    blocks = [group.ranks * s for s in sizes]
    default = run_sweep(pair, tmp, f"default-pp-{rep}", sizes, "pingpong")
    default |= run_sweep(group, tmp, f"default-{rep}", sorted({*sizes, *blocks}), ",".join(COLLECTIVES))
    warm = run_sweep(pair, tmp, f"warm-pp-{rep}", sizes, "pingpong", "--cache", "warm")
    warm |= run_sweep(group, tmp, f"warm-{rep}", sizes, "allreduce", "--cache", "warm")
    mt = ("--cache", "warm", "--thread-level", "multiple")
    multiple = run_sweep(pair, tmp, f"warmmt-pp-{rep}", sizes, "pingpong", *mt)
    multiple |= run_sweep(group, tmp, f"warmmt-{rep}", sizes, "allreduce", *mt)
    return {"default": default | {("bw", s): t for (op, s), t in default.items() if op == "pingpong"},
            "warm": warm, "warm-multiple": multiple}


def run_reference(jobs: Jobs, exe: Path, sizes: list[int]) -> dict[str, Table]:
    """The C loop's medians: "c" on a warm pair, "c-cold" rotating through the default method's cold pool; its
    ping-pong on the pair's job, its allreduce on the collectives' (as commcal's default runs them)."""
    out: dict[str, Table] = {"c": {}, "c-cold": {}}
    for launch in dict.fromkeys((jobs.pair, jobs.group)):
        for line in launch.run([str(exe), *map(str, sizes)]).splitlines():
            op, mode, size, us = line.split()
            if jobs.of(op) is launch:
                out["c" if mode == "warm" else "c-cold"][(op, int(size))] = float(us) * 1e-6
    return out


def median_of(reps: list[Table], key) -> float | None:
    vals = [t[key] for t in reps if key in t]
    return statistics.median(vals) if vals else None


def paired_ratio(tops: list[Table], bottoms: list[Table], key) -> float | None:
    """The median over runs of top/bottom within each run (drift between runs cancels), or None."""
    vals = [a[key] / b[key] for a, b in zip(tops, bottoms) if key in a and b.get(key)]
    return statistics.median(vals) if vals else None


def best_ratio(tops: list[Table], bottoms: list[Table], key) -> float | None:
    """The fastest run's figure over the other's fastest: on a machine whose speed changes from job to job (e.g.
    where the hypervisor puts the vCPUs), the runs that met the fast mode compared with each other."""
    a, b = [t[key] for t in tops if key in t], [t[key] for t in bottoms if t.get(key)]
    return min(a) / min(b) if a and b else None


def _num(x: float | None) -> str:
    return f"{x:7.3f}" if x is not None else f"{'-':>7}"


def _us(x: float | None) -> str:
    return f"{x * 1e6:10.3f}" if x is not None else f"{'-':>10}"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:7.3f}" if a is not None and b else f"{'-':>7}"


def whole(op: str, size: int, peer: str, procs: int) -> int:
    return METHODS[peer].commcal_bytes(op, size, procs)


def print_tables(results: dict[str, list[Table]], sizes: list[int], procs: int, notes: list[str]) -> None:
    for peer in ("osu", "imb"):
        if not results.get(peer):
            continue
        repeat = results.get(f"{peer}-repeat", [])
        again_note = f"; repeat: the same of a second {peer} run" if repeat else ""
        print(f"\n## {peer.upper()} (peer sizes; medians of {len(results[peer])} alternated runs, us; paired: median "
              f"over runs of commcal/{peer} in the same run{again_note}; best: fastest run against fastest run)")
        print(f"{'op':<15}{'size':>6} {peer:>10} {'reference':>10} {'ref/peer':>8} {'paired':>7} {'repeat':>7} "
              f"{'best':>7} {'b.rep':>7} {'default':>10} {'def/peer':>8}")
        within, ceiling, best_within, best_ceiling, points = 0, 0, 0, 0, 0
        for op in OPS:
            for size in sizes:
                key = (op, whole(op, size, peer, procs))
                p, r, d = (median_of(results[name], key) for name in (peer, f"commcal-{peer}", "commcal-default"))
                if p is None:
                    continue
                paired = paired_ratio(results[f"commcal-{peer}"], results[peer], key)
                again = paired_ratio(repeat, results[peer], key)
                best, best_again = (best_ratio(top, results[peer], key) for top in (results[f"commcal-{peer}"], repeat))
                points += 1
                within += paired is not None and abs(paired - 1) <= 0.05
                ceiling += again is not None and abs(again - 1) <= 0.05
                best_within += best is not None and abs(best - 1) <= 0.05
                best_ceiling += best_again is not None and abs(best_again - 1) <= 0.05
                print(f"{op:<15}{format_size(size):>6} {_us(p)} {_us(r)} {_ratio(r, p):>8} {_num(paired)} "
                      f"{_num(again)} {_num(best)} {_num(best_again)} {_us(d)} {_ratio(d, p):>8}")
        print(f"reference/{peer} within 5%: paired {within}, best {best_within} of {points} points (target for OSU: "
              "all)" + (f"; {peer} against its own repeat: paired {ceiling}, best {best_ceiling} (the noise ceiling)"
                        if repeat else ""))
    if results.get("c"):
        print(f"\n## default method against the standalone C loop timing the same way (benchmarks/ref_main.c), us")
        print("# cold: both rotate through the same 64 MiB pool; warm: both reuse one pair; mt: commcal at "
              "MPI_THREAD_MULTIPLE against the C loop's warm single")
        print(f"{'op':<11}{'size':>6} {'C cold':>10} {'default':>10} {'def/C':>7} {'C warm':>10} {'warm':>10} "
              f"{'warm/C':>7} {'warm mt':>10} {'mt/C':>7}")
        for op in ("pingpong", "allreduce"):
            for size in sizes:
                cc, cw = (median_of(results.get(n, []), (op, size)) for n in ("c-cold", "c"))
                d, w, m = (median_of(results[n], (op, size)) for n in ("commcal-default", "commcal-warm",
                                                                      "commcal-warm-multiple"))
                print(f"{op:<11}{format_size(size):>6} {_us(cc)} {_us(d)} {_ratio(d, cc)} {_us(cw)} {_us(w)} "
                      f"{_ratio(w, cw)} {_us(m)} {_ratio(m, cw)}")
    if results.get("osu"):
        print("\n## ping-pong: from OSU's figure to the default method's, one difference at a time (us)")
        steps = (("osu_latency", "osu"), ("commcal --method osu", "commcal-osu"),
                 ("C loop: barrier each call, max over ranks, single", "c"),
                 ("default --cache warm (single)", "commcal-warm"),
                 ("default --cache warm --thread-level multiple", "commcal-warm-multiple"),
                 ("C loop as above, cold buffers", "c-cold"),
                 ("default (cold buffers, single)", "commcal-default"))
        print(f"{'':<52}" + "".join(f"{format_size(s):>10}" for s in sizes))
        for label, name in steps:
            print(f"{label:<52}" + "".join(_us(median_of(results.get(name, []), ("pingpong", s))) for s in sizes))
    for note in notes:
        print(f"# {note}")


def mpi_version(mpicc: str) -> str:
    info = shutil.which("ompi_info", path=str(Path(mpicc).parent))
    if info is None:
        return "MPI version unknown"
    proc = subprocess.run([info, "--version"], capture_output=True, text=True, timeout=60)
    return (proc.stdout.strip().splitlines() or ["MPI version unknown"])[0]


def main(argv: list[str] | None = None) -> int:
    ap = benchmark_parser("benchmarks.peers", __doc__)
    ap.add_argument("--reps", type=int, default=3, help="alternated runs of every tool (default 3)")
    ap.add_argument("--sizes", default="8,64,1K,8K,64K,512K,4M",
                    help="powers of two from 8 B to 4 MiB, the peers' convention (default 8,64,1K,8K,64K,512K,4M)")
    ap.add_argument("--launch", help="launcher prefix of the 2-rank jobs: ping-pong, osu_bw, the C loop, and the "
                    "collectives unless --group-launch (default: local mpirun -n 2 --oversubscribe --bind-to none); "
                    "across two nodes of the local cluster: \"slurm/cluster.sh mpirun -n 2 --host node1:1,node2:1\"")
    ap.add_argument("--group-launch", help="launcher prefix of the collectives' jobs, with --group-ranks ranks "
                    "(e.g. 2 nodes x 2 ranks: \"slurm/cluster.sh mpirun -n 4 --host node1:2,node2:2\")")
    ap.add_argument("--group-ranks", type=int, default=2, help="ranks of --group-launch's jobs (default 2)")
    args = ap.parse_args(argv)
    sizes = parse_sizes(args.sizes)
    if any(s & (s - 1) for s in sizes):
        raise SystemExit("--sizes must be powers of two (the peers step by powers of two)")
    mpicc = cloop.find_mpicc()
    if mpicc is None:
        print("skipped: no MPI compiler wrapper (mpicc) to build the peers with")
        return 0
    notes, bins = [], {}
    for peer in ("osu", "imb"):
        bins[peer], note = build(peer, mpicc)
        notes.append(f"{peer}: {note}" if bins[peer] else f"{peer}: skipped, {note}")
    exe = build_reference(mpicc)
    if args.group_launch is None and args.group_ranks != 2:
        raise SystemExit("--group-ranks needs --group-launch")
    pair = Launcher(mpicc, args.launch)
    jobs = Jobs(pair, Launcher(mpicc, args.group_launch, args.group_ranks) if args.group_launch else pair)
    results: dict[str, list[Table]] = {}
    with tempfile.TemporaryDirectory(prefix="commcal-peers-") as tmp:
        for rep in range(args.reps):
            print(f"repetition {rep + 1}/{args.reps}", file=sys.stderr, flush=True)
            tables = run_references(jobs, bins, Path(tmp), sizes, rep)
            tables |= {f"commcal-{name}": t for name, t in run_defaults(jobs, Path(tmp), sizes, rep).items()}
            tables |= run_reference(jobs, exe, sizes)
            for name, table in tables.items():
                results.setdefault(name, []).append(table)
    where = f"launched by {args.launch}" if args.launch else "2 local ranks"
    if args.group_launch:
        where += f"; collectives on {args.group_ranks} ranks launched by {args.group_launch}"
    print(f"# {where}, {args.reps} alternated runs, sizes {args.sizes}; {mpi_version(mpicc)}; "
          f"dropped from every job's environment: {', '.join(Launcher.DROPPED)}")
    print_tables(results, sizes, jobs.group.ranks, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
