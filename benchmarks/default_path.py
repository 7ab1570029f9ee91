"""Benchmark (issue 31): the README's default path on the local cluster, at one or more link rates. For each rate it
brings the local cluster up (Open MPI's defaults, nothing tuned), calibrates with `sbatch slurm/sweep.sh` and its
defaults, validates layers of its own twice with `sbatch slurm/validate.sh`, and prints the calibration's comm
ranking metrics beside one validate's measurements scored as the prediction of the other's (the figures no cost
model can beat where measurements repeat only that well), with the gaps issue 31 sets (accuracy within 0.03, Kendall
tau within 0.05). Needs root and Slurm (what the cluster tier of the tests needs); takes a cluster no one else uses.

    python -m benchmarks.default_path --out /tmp/dp --rates 800mbit,400mbit                # 2 nodes x 1 rank
    python -m benchmarks.default_path --out /tmp/dp --rates 400mbit --tasks-per-node 2     # 2x2
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.validate import _print, guarded, score_runs
from benchmarks import benchmark_parser

REPO = Path(__file__).resolve().parent.parent
CLUSTER = REPO / "slurm" / "cluster.sh"
# Shapes of no test or benchmark: the calibration never saw them, and neither did whoever set its defaults.
LAYERS = ("linear:m=384,k=768,n=1536", "mlp:batch=192,d_in=640,d_hidden=1280",
          "embedding:vocab=6144,dim=320,tokens=768,density=0.05")
GAPS = (("comm_mean_accuracy", 0.03), ("comm_kendall_tau", 0.05))


def _env(state: Path) -> dict[str, str]:
    """This process's environment for cluster.sh: the venv's commcal first on PATH, no Slurm job or commcal settings
    leaking in (the default path is the point), the cluster's state in `state`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "COMMCAL_", "OMPI_MCA_", "PRTE_MCA_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["COMMCAL_CLUSTER_DIR"] = str(state)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _cluster(env: dict, *args: str, timeout: float = 300) -> str:
    print("$ slurm/cluster.sh", shlex.join(args), flush=True)
    proc = subprocess.run([str(CLUSTER), *args], env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, [str(CLUSTER), *args], proc.stdout, proc.stderr)
    return proc.stdout


def _job(env: dict, work: Path, script: str, nodes: int, per_node: int, extra: dict[str, str], limit_s: int,
         resubmits: int = 0) -> None:
    """sbatch a script of slurm/ with these variables and wait for it. A job that hits its time limit is submitted
    again, up to `resubmits` times, as its docs tell a user (finished points are kept, and the next job resumes);
    any other failure ends the benchmark."""
    t0 = time.monotonic()
    minutes = -(-limit_s // 60)
    for attempt in range(resubmits + 1):
        job = _cluster({**env, **extra}, "sbatch", "--parsable", f"-N{nodes}", f"--ntasks-per-node={per_node}",
                       f"--chdir={work}", "-t", str(minutes), "-o", f"{Path(script).stem}-%j.out",
                       str(REPO / "slurm" / script)).strip().split(";")[0]
        # Slurm ends the job at its limit and then waits its KillWait (30 s by default) before TIMEOUT shows
        wait_s = minutes * 60 + 120
        try:
            _cluster(env, "wait", job, str(wait_s), timeout=wait_s + 60)
            break
        except subprocess.CalledProcessError as exc:
            if f"job {job} TIMEOUT" in (exc.stdout or "") and attempt < resubmits:
                print(f"  job {job}: {script} hit its {minutes} min limit; submitted again to resume "
                      f"({attempt + 1} of {resubmits})", flush=True)
                continue
            log = next(work.glob(f"{Path(script).stem}-{job}.out"), None)
            print(log.read_text()[-3000:] if log else "(no job output)", file=sys.stderr)
            raise
    print(f"  job {job}: {script} ({time.monotonic() - t0:.0f} s)", flush=True)


def one_rate(rate: str, args: argparse.Namespace, out: Path) -> dict[str, tuple[float, float]]:
    """The default path at one rate; returns {metric: (calibration's mean over runs, the repeats' mean)}."""
    env = _env(out / "state")
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    _cluster(env, "up", "--nodes", str(args.nodes), "--rate", rate, timeout=120)
    try:
        cal = work / "calibration.json"
        _job(env, work, "sweep.sh", args.nodes, args.tasks_per_node, {"COMMCAL_CALIBRATION": str(cal)},
             args.sweep_limit, args.resubmits)
        mesh = args.mesh or (f"{args.nodes}x{args.tasks_per_node}" if args.tasks_per_node > 1 else str(args.nodes))
        layers = " ".join(f"--layer {spec}" for spec in args.layer or LAYERS)
        runs = []
        for i in range(args.repeat):
            run = out / f"validate-{i + 1}"
            _job(env, work, "validate.sh", args.nodes, args.tasks_per_node,
                 {"COMMCAL_CALIBRATION": str(cal), "COMMCAL_PRESET": "full", "COMMCAL_VALIDATE_OUT": str(run),
                  "COMMCAL_VALIDATE_ARGS": f"--mesh {mesh} {layers}"}, args.validate_limit)
            runs.append(run)
    finally:
        subprocess.run([str(CLUSTER), "down"], env=env, capture_output=True, text=True, timeout=120)
    _, columns, _ = score_runs(runs)
    print(f"rate {rate}, calibration {cal}:")
    _print(columns)
    calib = [m for c, m in columns.items() if c.startswith("run")]
    repeat = [m for c, m in columns.items() if " as " in c]
    return {name: (sum(m[name]["value"] for m in calib) / len(calib), sum(m[name]["value"] for m in repeat) / len(repeat))
            for name, _ in GAPS}


def _bench(argv) -> int:
    p = benchmark_parser("benchmarks.default_path", __doc__)
    p.add_argument("--out", required=True)
    p.add_argument("--rates", default="800mbit,400mbit", help="token-bucket rates of the nodes' links, comma-separated")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--tasks-per-node", type=int, default=1, help="ranks per node (1: the inter-node placement alone)")
    p.add_argument("--mesh", help="validate's mesh (default NODES, or NODESxTASKS_PER_NODE)")
    p.add_argument("--layer", action="append", metavar="SPEC", help="layers to validate (repeatable; default three "
                                                                     "shapes no test uses)")
    p.add_argument("--repeat", type=int, default=2, help="validates per rate (at least 2: the repeat is the ceiling)")
    p.add_argument("--sweep-limit", type=int, default=3600, help="seconds the sweep job may take")
    p.add_argument("--resubmits", type=int, default=2, help="times a sweep job that hits its limit is submitted again "
                                                            "to resume (default 2)")
    p.add_argument("--validate-limit", type=int, default=1200, help="seconds each validate job may take")
    args = p.parse_args(argv)
    if args.repeat < 2:
        p.error("--repeat must be at least 2")
    if args.resubmits < 0 or args.sweep_limit < 1 or args.validate_limit < 1:
        p.error("--resubmits must be at least 0, the limits at least 1 s")
    out = Path(args.out)
    rows = {}
    for rate in args.rates.split(","):
        rows[rate] = one_rate(rate, args, out / rate)
    print("\n" + "\n".join(verdicts(rows)))
    return 0


def verdicts(rows: dict[str, dict[str, tuple[float, float]]]) -> list[str]:
    """The table of gaps: per rate and metric the calibration's mean, the repeat's, how far the calibration falls
    short of the repeat (negative: it did better) and whether that is within GAPS."""
    lines = [f"{'rate':<10} {'metric':<20} {'calibration':>11} {'repeat':>8} {'gap':>7}  target"]
    for rate, metrics in rows.items():
        for name, allowed in GAPS:
            c, r = metrics[name]
            lines.append(f"{rate:<10} {name:<20} {c:>11.4f} {r:>8.4f} {r - c:>7.4f}  <= {allowed:g} "
                         + ("MET" if r - c <= allowed else "missed"))
    return lines


def main(argv=None) -> int:
    return guarded(_bench, argv, "bench_default_path")


if __name__ == "__main__":
    sys.exit(main())
