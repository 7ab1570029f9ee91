"""Benchmark: commcal beside the OSU Micro-Benchmarks 7.5 and IMB 2021.11 on 2 local ranks, with their own binaries.

Run as one plain process (it starts every mpirun job itself): `python -m benchmarks.peers [--reps 3]`.
It builds OSU and IMB from ../shared/peers/*.tar.gz (or $COMMCAL_PEERS_DIR) with the MPI's own mpicc in a temporary
directory, keeps the binaries under ~/.cache/commcal/peers (so repeats start at once; their code is never part of
this repository), and skips a peer with its reason where its sources or a compiler are absent or the build fails.
Then, `--reps` times in turn (alternated, so drift on a shared machine falls on every tool alike), it runs:
the OSU binaries, IMB-MPI1, `commcal sweep --method osu`, `--method osu-window`, `--method imb`, commcal's default
method (cold buffers) and with `--cache warm`, and a standalone C program timing ping-pong and allreduce as the
default method does (benchmarks/ref_main.c, MPI_THREAD_SINGLE). It prints, per operation and size (the peers'
convention: allgather and alltoall sizes per rank), the medians over the repetitions and the ratios commcal/peer
for the reference and the default modes (the default at the same whole-buffer size), then the default method against the C loop, then the ping-pong
decomposition of the default mode's gap to OSU (thread level, cold buffers, per-call barrier and max over ranks).
Targets (issue 33): reference mode within 5% of OSU at every size for every shared op; default mode at 8 B within
1.10x of the C loop."""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from calib.peers import imb, osu
from calib.peers.model import Job
from microbench import cloop
from microbench.methods import METHODS
from microbench.records import load_summary
from microbench.sizes import format_size, parse_sizes

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
    """Runs a 2-rank job: local mpirun (2 ranks, unbound), or the --launch prefix (e.g. across two nodes)."""

    def __init__(self, mpicc: str, launch: str | None = None) -> None:
        mpirun = shutil.which("mpirun", path=str(Path(mpicc).parent)) or shutil.which("mpirun")
        self.prefix = shlex.split(launch) if launch else [mpirun, "-n", "2", "--oversubscribe", "--bind-to", "none"]
        self.env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                        PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.env.pop("MPI4PY_RC_THREAD_LEVEL", None)

    def run(self, argv: list[str], timeout: float = 900) -> str:
        proc = subprocess.run([*self.prefix, *argv], env=self.env,
                              capture_output=True, text=True, timeout=timeout, cwd=REPO)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:6])} exited {proc.returncode}: {proc.stderr.strip()[-400:]}")
        return proc.stdout


Table = dict[tuple[str, int], float]
"""(op, size in commcal's convention) -> seconds."""


def run_osu(launch: Launcher, bindir: Path, sizes: list[int]) -> Table:
    out: Table = {}
    for key, binary in OSU_BINARIES.items():
        text = launch.run([str(bindir / binary), "-m", f"{min(sizes)}:{max(sizes)}"])
        log = osu.read_text(Path(binary), text, Job(world=2))
        for p in log.points:
            out[(key, p.size_bytes)] = p.seconds
    return out


def run_imb(launch: Launcher, bindir: Path, sizes: list[int]) -> Table:
    lo, hi = min(sizes).bit_length() - 1, max(sizes).bit_length() - 1
    text = launch.run([str(bindir / "IMB-MPI1"), "-npmin", "2", "-msglog", f"{lo}:{hi}", *IMB_NAMES.values()])
    return {(p.op, p.size_bytes): p.seconds for p in imb.read_text(Path("IMB-MPI1"), text, Job(world=2)).points}


def run_sweep(launch: Launcher, tmp: Path, name: str, sizes: list[int], ops: str, *extra: str, key: str = "") -> Table:
    out = tmp / name
    shutil.rmtree(out, ignore_errors=True)
    launch.run([sys.executable, "-m", "reports.cli", "sweep", "--out", str(out), "--ops", ops,
                "--sizes", ",".join(map(str, sizes)), *SWEEP, *extra])
    s = load_summary(out)
    return {(key or op, int(size)): float(t) for op, size, t in zip(s["op"], s["size_bytes"], s["median_s"])}


def run_commcal(launch: Launcher, tmp: Path, sizes: list[int], rep: int) -> dict[str, Table]:
    """Every commcal mode of one repetition: the reference modes in the peers' sizes, the default method (cold
    and warm) at the same whole-buffer sizes (allgather and alltoall: 2 ranks' blocks)."""
    ref_ops = "pingpong," + ",".join(COLLECTIVES)
    doubled = [2 * s for s in sizes]
    default = run_sweep(launch, tmp, f"default-{rep}", sizes, "pingpong,allreduce,bcast,reduce,reduce_scatter")
    default |= run_sweep(launch, tmp, f"default2-{rep}", doubled, "allgather,alltoall,reduce_scatter")
    warm = run_sweep(launch, tmp, f"warm-{rep}", sizes, "pingpong,allreduce", "--cache", "warm")
    return {
        "osu": run_sweep(launch, tmp, f"osu-{rep}", sizes, ref_ops, "--method", "osu")
        | run_sweep(launch, tmp, f"bw-{rep}", sizes, "pingpong", "--method", "osu-window", key="bw"),
        "imb": run_sweep(launch, tmp, f"imb-{rep}", sizes, ref_ops, "--method", "imb"),
        "default": default | {("bw", s): t for (op, s), t in default.items() if op == "pingpong"},
        "warm": warm,
        "warm-multiple": run_sweep(launch, tmp, f"warmmt-{rep}", sizes, "pingpong,allreduce", "--cache", "warm",
                                   "--thread-level", "multiple"),
    }


def run_reference(launch: Launcher, exe: Path, sizes: list[int]) -> Table:
    out: Table = {}
    for line in launch.run([str(exe), *map(str, sizes)]).splitlines():
        op, size, us = line.split()
        out[(op, int(size))] = float(us) * 1e-6
    return out


def median_of(reps: list[Table], key) -> float | None:
    vals = [t[key] for t in reps if key in t]
    return statistics.median(vals) if vals else None


def _us(x: float | None) -> str:
    return f"{x * 1e6:10.3f}" if x is not None else f"{'-':>10}"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:7.3f}" if a is not None and b else f"{'-':>7}"


def whole(op: str, size: int, peer: str) -> int:
    return METHODS[peer].commcal_bytes(op, size, 2)


def print_tables(results: dict[str, list[Table]], sizes: list[int], notes: list[str]) -> None:
    for peer in ("osu", "imb"):
        if not results.get(peer):
            continue
        print(f"\n## {peer.upper()} (peer sizes; medians of {len(results[peer])} alternated runs, us)")
        print(f"{'op':<15}{'size':>6} {peer:>10} {'reference':>10} {'ref/peer':>8} {'default':>10} {'def/peer':>8}")
        worst = 0.0
        for op in OPS:
            for size in sizes:
                key = (op, whole(op, size, peer))
                p, r, d = (median_of(results[name], key) for name in (peer, f"commcal-{peer}", "commcal-default"))
                if p is None:
                    continue
                if r is not None:
                    worst = max(worst, abs(r / p - 1))
                print(f"{op:<15}{format_size(size):>6} {_us(p)} {_us(r)} {_ratio(r, p):>8} {_us(d)} {_ratio(d, p):>8}")
        print(f"largest |reference/{peer} - 1|: {worst:.1%} (target for OSU: 5%)")
    if results.get("c"):
        print(f"\n## default method against the standalone C loop (benchmarks/ref_main.c), us")
        print(f"{'op':<11}{'size':>6} {'C loop':>10} {'default':>10} {'def/C':>7} {'warm':>10} {'warm/C':>7} "
              f"{'warm mt':>10} {'mt/C':>7}")
        for op in ("pingpong", "allreduce"):
            for size in sizes:
                c = median_of(results["c"], (op, size))
                d, w, m = (median_of(results[n], (op, size)) for n in ("commcal-default", "commcal-warm",
                                                                      "commcal-warm-multiple"))
                print(f"{op:<11}{format_size(size):>6} {_us(c)} {_us(d)} {_ratio(d, c)} {_us(w)} {_ratio(w, c)} "
                      f"{_us(m)} {_ratio(m, c)}")
    if results.get("osu"):
        print("\n## ping-pong: from OSU's figure to the default method's, one difference at a time (us)")
        steps = (("osu_latency", "osu"), ("commcal --method osu", "commcal-osu"),
                 ("C loop: barrier each call, max over ranks, single", "c"),
                 ("default --cache warm (single)", "commcal-warm"),
                 ("default --cache warm --thread-level multiple", "commcal-warm-multiple"),
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
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="alternated runs of every tool (default 3)")
    ap.add_argument("--sizes", default="8,64,1K,8K,64K,512K,4M",
                    help="powers of two from 8 B to 4 MiB, the peers' convention (default 8,64,1K,8K,64K,512K,4M)")
    ap.add_argument("--launch", help="launcher prefix of every 2-rank job (default: local mpirun -n 2 --oversubscribe "
                    "--bind-to none); across two nodes of the local cluster: "
                    "\"slurm/cluster.sh mpirun -n 2 --host node1:1,node2:1\"")
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
    launch = Launcher(mpicc, args.launch)
    results: dict[str, list[Table]] = {}
    with tempfile.TemporaryDirectory(prefix="commcal-peers-") as tmp:
        for rep in range(args.reps):
            print(f"repetition {rep + 1}/{args.reps}", file=sys.stderr, flush=True)
            if bins["osu"]:
                results.setdefault("osu", []).append(run_osu(launch, bins["osu"], sizes))
            if bins["imb"]:
                results.setdefault("imb", []).append(run_imb(launch, bins["imb"], sizes))
            for name, table in run_commcal(launch, Path(tmp), sizes, rep).items():
                results.setdefault(f"commcal-{name}", []).append(table)
            results.setdefault("c", []).append(run_reference(launch, exe, sizes))
    where = f"launched by {args.launch}" if args.launch else "2 local ranks"
    print(f"# {where}, {args.reps} alternated runs, sizes {args.sizes}; {mpi_version(mpicc)}")
    print_tables(results, sizes, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
