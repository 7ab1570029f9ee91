"""Peer logs into a commcal run directory (microbench.records' format, written by microbench.store.RunStore) that
fit, report and diff read like a sweep's. Each point's samples are the peer's statistic (one per point) or its
per-iteration times; run.json's `origin` says which peer, method and statistic, so nothing reads as a commcal
median that is not one."""

from __future__ import annotations

import math
import os
import secrets
import shutil
from dataclasses import dataclass
from itertools import takewhile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from calib.peers.model import ITEMSIZE, PeerLog, PeerPoint, fail
from calib.points import SECONDS
from microbench.errors import UsageError
from microbench.ops import OPS
from microbench.links import LINK_CLASSES, link_of
from microbench.records import RUN_SCHEMA, RUN_SCHEMA_VERSION, PointKey, PointSummary
from microbench.limits import MAX_BYTES, MAX_RANKS
from microbench.stats import estimate
from microbench.store import RunStore


@dataclass(frozen=True)
class Placement:
    """How ranks lie on nodes for one process count: commcal's link class and the node shape."""

    link: str
    nodes: int
    ranks_per_node: int


def parse_hosts(text: str) -> tuple[str, ...]:
    """mpirun's host list, 'n1:2,n2:2' (slots per host; a bare name is one slot), as each rank's host in rank order
    (ranks fill a host's slots before the next, as `--host` places them by default)."""
    ranks: list[str] = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, _, slots = item.partition(":")
        if not name or (slots and not (slots.isascii() and slots.isdigit())) or slots == "0":
            raise UsageError(f"--hosts: {item!r} is not HOST or HOST:SLOTS")
        if len(ranks) + int(slots or 1) > MAX_RANKS:
            raise UsageError(f"--hosts: more than {MAX_RANKS} ranks")
        ranks += [name] * int(slots or 1)
    if not ranks:
        raise UsageError("--hosts: no hosts given")
    return tuple(ranks)


def placement(procs: int, hosts: tuple[str, ...], link: str | None, where: str) -> Placement:
    """The link class of the first `procs` ranks (IMB runs a smaller block on the first ranks): from the hosts
    where known (a --link that disagrees is an error), else from --link; UsageError when neither says."""
    if hosts:
        if procs > len(hosts):
            raise UsageError(f"{where}: {procs} processes, but the host list places {len(hosts)}")
        used = hosts[:procs]
        counts = [used.count(h) for h in dict.fromkeys(used)]
        found = Placement(link_of(len(counts), max(counts)), len(counts), max(counts))
        if link is not None and link != found.link:
            raise UsageError(f"{where}: --link {link} disagrees with the host list, which places {procs} ranks as "
                             f"{found.link} ({found.nodes} nodes, up to {found.ranks_per_node} per node)")
        return found
    if link == "intra":
        return Placement("intra", 1, procs)
    if link == "inter":
        return Placement("inter", procs, 1)
    if link == "spread":
        raise UsageError(f"{where}: --link spread needs --hosts to say how many ranks share each node")
    raise UsageError(f"{where}: the log does not say where its ranks ran: give --hosts (mpirun's host list) or "
                     f"--link {'|'.join(LINK_CLASSES)}")


def origin(logs: list[PeerLog]) -> dict:
    """run.json's (and the calibration's) record of where the numbers came from: peer, version, method and each
    log's command line and statistic."""
    first = logs[0]
    return {"peer": first.peer, "version": first.version, "method": first.method,
            "logs": [{"file": log.path, "command_line": log.command_line or "not in the log",
                      "statistic": log.statistic} for log in logs]}


def check_alike(logs: list[PeerLog]) -> None:
    """UsageError unless every log comes from one peer, method and backend (one run directory has one origin)."""
    for what in ("method", "peer", "backend"):
        kinds = sorted({getattr(log, what) for log in logs})
        if len(kinds) > 1:
            raise UsageError(f"logs mix {what}s {' and '.join(kinds)}: import them into separate run directories "
                             f"(fit joins runs of different methods with --mix-methods)")


def _summary(run_id: str, log: PeerLog, p: PeerPoint, where: Placement,
             in_place: bool) -> tuple[PointSummary, np.ndarray]:
    """One point's summary row (statistics of the samples written) and those samples."""
    samples = np.asarray(p.samples or (p.seconds,), dtype=float)
    est = estimate(samples)
    key = PointKey(log.backend, p.op, where.link, p.procs, p.size_bytes, p.dtype)
    op = OPS[p.op]
    blocks = p.procs if op.recv_blocks and not op.send_blocks else 1
    nan = math.nan
    return PointSummary(
        run_id=run_id, point_id=key.point_id, backend=log.backend, op=p.op, link=where.link, nodes=where.nodes,
        ranks_per_node=where.ranks_per_node, procs=p.procs, requested_bytes=p.size_bytes, size_bytes=p.size_bytes,
        count=p.size_bytes // blocks // ITEMSIZE[p.dtype], dtype=p.dtype,
        bytes_per_rank=op.bytes_per_rank(p.size_bytes, p.procs), in_place=in_place, timing_path=f"peer:{log.peer}",
        samples=est.samples, median_s=est.median, ci_low_s=est.ci_low, ci_high_s=est.ci_high, min_s=est.min,
        p95_s=est.p95, mean_s=est.mean, target_ci=nan, target_met=False, algbw_Bps=p.size_bytes / est.median,
        busbw_Bps=p.size_bytes / est.median * op.bus_factor(p.procs), wrong=p.wrong, flops=0.0,
        flops_per_s=0.0), samples


def _rows(run_id: str, logs: list[PeerLog], hosts: tuple[str, ...], link: str | None,
          in_place: bool) -> list[tuple[PointSummary, np.ndarray]]:
    """Every log's points as summary rows and samples, or the one-line error for the first a run cannot hold (a count,
    size or time out of bounds, a link class unknown, a point measured twice)."""
    rows, seen = [], {}
    low, high = SECONDS
    for log in logs:
        for p in log.points:
            if not (1 <= p.procs <= MAX_RANKS and 1 <= p.size_bytes <= MAX_BYTES):
                raise fail(log.path, p.line, f"{p.procs} processes and {p.size_bytes} bytes: not what a run holds "
                                             f"(1 to {MAX_RANKS} processes, 1 to {MAX_BYTES} bytes)")
            if not all(low <= t <= high for t in (p.seconds, *p.samples)):
                raise fail(log.path, p.line, f"a time outside {low:g} to {high:g} s (the times a fit uses)")
            where = placement(p.procs, log.hosts or hosts, link, f"{log.path}:{p.line}")
            summary, samples = _summary(run_id, log, p, where, in_place)
            if summary.point_id in seen:
                raise fail(log.path, p.line, f"measures {summary.point_id} again (first at {seen[summary.point_id]})")
            seen[summary.point_id] = f"{log.path}:{p.line}"
            rows.append((summary, samples))
        if log.world is not None and not 1 <= log.world <= MAX_RANKS:
            raise fail(log.path, 0, f"a job of {log.world} ranks: not what a run holds (1 to {MAX_RANKS})")
    return rows


def _empty(directory: Path) -> None:
    """Remove what a failed import wrote into `directory`, which it found empty."""
    for child in directory.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _remove_empty(directories: list[Path]) -> None:
    """Remove the parents a failed import made for a new --out, deepest first, while they are empty."""
    for d in directories:
        try:
            d.rmdir()
        except OSError:
            return


def _write_whole(out: Path, rows: list[tuple[PointSummary, np.ndarray]], meta: dict) -> None:
    """Write the run whole or not at all: a new `out` as a hidden directory beside it, renamed into place; an existing
    (empty) one in place, emptied again when the import fails part way (a full disk), so it keeps its owner and mode."""
    target = Path(os.path.realpath(out))
    fresh = not target.exists()
    stage = target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp" if fresh else target
    made = list(takewhile(lambda d: not d.exists(), (target.parent, *target.parent.parents)))  # deepest first
    try:
        stage.mkdir(parents=True, exist_ok=not fresh)
    except OSError as exc:
        _remove_empty(made)
        raise UsageError(f"--out {out}: cannot create the run directory ({exc.strerror or exc})") from None
    done = False
    try:
        store = RunStore(stage)
        store.prepare(resume=False)
        for summary, samples in rows:
            store.write_point(summary, samples, np.zeros(len(samples), dtype=np.int64))
        store.write_run(meta)
        store.consolidate()
        if fresh:
            os.replace(stage, target)
        done = True
    except (OSError, UsageError) as exc:       # atomic_write names the file it could not write: here, inside --out
        why = exc.strerror or exc if isinstance(exc, OSError) else str(exc).replace(f"{stage}{os.sep}", "")
        raise UsageError(f"--out {out}: cannot write the run directory ({why})") from None
    finally:
        if fresh:
            shutil.rmtree(stage, ignore_errors=True)
        elif not done:
            _empty(target)
        if not done:
            _remove_empty(made)


def write_run(out: str | Path, logs: list[PeerLog], hosts: tuple[str, ...], link: str | None, in_place: bool,
              command_line: list[str]) -> dict:
    """Write the run directory `out` from `logs` (one peer and method), whole or not at all; returns its run.json.
    `hosts`: each rank's host from --hosts (a log's own host list wins where it has one); `link`: --link."""
    check_alike(logs)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a directory")
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out} exists and is not empty; choose another directory")
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    first = logs[0]
    # the second's stamp and a random tag: two imports within one second stay two runs
    run_id = f"import-{first.peer}-{now.replace(':', '').replace('-', '')[:15]}-{secrets.token_hex(3)}"
    rows = _rows(run_id, logs, hosts, link, in_place)
    ranks = logs[-1].hosts or hosts
    names = sorted(set(ranks))
    meta = {"schema": RUN_SCHEMA, "version": RUN_SCHEMA_VERSION, "run_id": run_id,
            "start_time": first.date or "unknown", "imported_utc": now, "machine": names[0] if names else "unknown",
            "hosts": names, "world_size": max((log.world or 0) for log in logs) or max(p.procs for log in logs
                                                                                     for p in log.points),
            "ranks_per_node": {h: ranks.count(h) for h in dict.fromkeys(ranks)},
            "mpi_library_version": "unknown (not in the log)", "versions": {first.peer: first.version},
            "command_line": command_line, "backend": first.backend, "timing_path": f"peer:{first.peer}",
            "timing_note": first.statistic, "options": {"cache": "warm", "in_place": in_place},
            "origin": origin(logs)}
    _write_whole(out, rows, meta)
    return meta
