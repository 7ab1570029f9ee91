"""`commcal import LOG... --out RUN_DIR`: peer benchmark logs (nccl-tests text or -J JSON, OSU Micro-Benchmarks,
IMB-MPI1), recognised by content, into a run directory that fit, report and diff read like a sweep's."""

from __future__ import annotations

import argparse
import sys

from calib.peers import read_log
from calib.peers.model import Job
from calib.peers.rundir import parse_hosts, write_run
from microbench.errors import UsageError
from microbench.limits import MAX_RANKS
from microbench.links import LINK_CLASSES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("logs", nargs="+", metavar="LOG", help="peer benchmark output files (one peer and method per "
                                                         "import: nccl-tests, OSU latency/collectives, OSU bw/bibw "
                                                         "or IMB-MPI1)")
    p.add_argument("--out", required=True, metavar="RUN_DIR", help="run directory to write (new or empty)")
    p.add_argument("--hosts", metavar="HOST[:SLOTS],...",
                   help="where the job's ranks ran, as mpirun --host (ranks fill each host's slots in order): gives "
                        "the process count and each point's link class where the log does not")
    p.add_argument("--link", choices=LINK_CLASSES,
                   help="the link class when the log and --hosts do not say (intra: one node; inter: one rank per "
                        "node; spread needs --hosts)")
    p.add_argument("--procs", type=int, metavar="N",
                   help="processes of the job (OSU collectives do not record it; default: the slots of --hosts)")
    p.add_argument("--in-place", action="store_true", help="nccl-tests: read the in-place half of each row")


def run(args: argparse.Namespace) -> int:
    hosts = parse_hosts(args.hosts) if args.hosts else ()
    if args.procs is not None and (not 1 <= args.procs <= MAX_RANKS or (hosts and args.procs != len(hosts))):
        raise UsageError(f"--procs {args.procs} must be 1 to {MAX_RANKS}"
                         + (f" and match the {len(hosts)} slots of --hosts" if hosts else ""))
    job = Job(world=args.procs or len(hosts) or None, in_place=args.in_place)
    logs = [read_log(path, job) for path in args.logs]
    for log in logs:
        if args.in_place and log.peer != "nccl-tests":
            raise UsageError(f"{log.path}: --in-place reads the in-place half of nccl-tests rows; a {log.peer} log "
                             f"has none")
        if log.world and job.world and log.world != job.world:
            raise UsageError(f"{log.path}: the log ran {log.world} ranks, not the {job.world} of --procs/--hosts")
    meta = write_run(args.out, logs, hosts, args.link, args.in_place, sys.argv)
    for log in logs:
        for line in log.skipped:
            print(f"note: {log.path}: left out {line}")
    points = sum(len(log.points) for log in logs)
    print(f"wrote {args.out}: {points} points from {len(logs)} {meta['origin']['peer']} log(s), method "
          f"{meta['origin']['method']} ({logs[0].statistic})")
    return 0
