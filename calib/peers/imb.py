"""IMB-MPI1 text output: every '# Benchmarking <name>' block, each with its own '#processes'.

IMB runs a block's benchmark on the first #processes ranks of the job (the others wait in a barrier), times a
back-to-back loop of #repetitions calls on each rank and prints, for collectives, the minimum, maximum and mean over
ranks of those loop means; the maximum (the slowest rank, as commcal times) is kept. PingPong's t[usec] is half the
round trip averaged over the loop (commcal's pingpong). Allgather, Alltoall and Reduce_scatter sizes are per rank; benchmarks
without a commcal operation (Barrier, the v-variants, Gather, Scatter, PingPing, Exchange, ...) and sizes IMB
gave up on ('time-out') are skipped and named in PeerLog.skipped."""

from __future__ import annotations

import re
from pathlib import Path

from calib.peers.model import Job, PeerLog, PeerPoint, fail, mpi_total_bytes, number, whole
from microbench.limits import MAX_RANKS

BANNER = re.compile(r"Intel\(R\) MPI Benchmarks (\S+?),? MPI-1 part")
BENCHMARKS = {"PingPong": "pingpong", "Sendrecv": "sendrecv", "Allreduce": "allreduce", "Allgather": "allgather",
              "Alltoall": "alltoall", "Bcast": "bcast", "Reduce": "reduce", "Reduce_scatter": "reduce_scatter",
              "Reduce_scatter_block": "reduce_scatter"}
REDUCTIONS = ("allreduce", "reduce", "reduce_scatter")
DTYPES = {"MPI_BYTE": "uint8", "MPI_CHAR": "int8", "MPI_FLOAT": "float32", "MPI_DOUBLE": "float64",
          "MPI_INT": "int32"}


def _job(path: Path, line: int, ranks: int) -> int:
    """The job's rank count so far, refused at the line that makes it more than any run holds."""
    if ranks > MAX_RANKS:
        raise fail(path, line, f"a job of {ranks} ranks: not what a run holds (1 to {MAX_RANKS})")
    return ranks


def read_text(path: Path, text: str, job: Job) -> PeerLog | None:
    """Every block of the IMB-MPI1 log in `text`, or None when `text` has no IMB-MPI1 banner."""
    lines = text.splitlines()
    banner = next(((i, m) for i, line in enumerate(lines, 1) if (m := BANNER.search(line))), None)
    if banner is None:
        return None
    at, match = banner
    version, command, date, skipped = match.group(1), "", "", []
    types = {"data": "uint8", "reduce": "float32"}
    name = op = header = None
    procs, largest, points = 0, 0, []
    for i, raw in enumerate(lines[at:], at + 1):
        line = raw.strip()
        body = line.lstrip("#").strip()
        if body.startswith("Date") and ":" in body:
            date = body.split(":", 1)[1].strip()
        elif body.startswith("Calling sequence was"):
            command = next((ln.lstrip("#").strip() for ln in lines[i:] if ln.lstrip("#").strip()), "")
        elif body.startswith("MPI_Datatype for reductions"):
            types["reduce"] = DTYPES.get(body.split(":", 1)[1].strip(), types["reduce"])
        elif body.startswith("MPI_Datatype") and ":" in body:
            types["data"] = DTYPES.get(body.split(":", 1)[1].strip(), types["data"])
        elif body.startswith("Benchmarking "):
            name, header, procs = body.split()[1], None, 0
            op = BENCHMARKS.get(name)
            if op is None and f"{name}: no commcal operation" not in skipped:
                skipped.append(f"{name}: no commcal operation")
        elif body.startswith("#processes ="):
            procs = whole(path, i, body.split("=", 1)[1].strip(), "#processes")
            largest = _job(path, i, max(largest, procs))
        elif body.startswith("(") and "additional processes" in body:
            largest = _job(path, i, max(largest, procs + whole(path, i, body.strip("( ").split()[0],
                                                                  "additional processes")))
        elif line.startswith("#bytes"):
            header = _header(path, i, line)
        elif line and not line.startswith("#") and op is not None and header is not None:
            if "time-out" in line:      # IMB gave up on this size: its time limit ran out
                skipped.append(f"{name} at {procs} processes, {line.split()[0]} bytes: IMB time-out (line {i})")
            else:
                points += _row(path, i, line, header, name, op, procs, types)
    if not points:
        raise fail(path, at, "IMB-MPI1 log with no block of a benchmark commcal has an operation for "
                             f"({', '.join(BENCHMARKS)})")
    return PeerLog(str(path), "imb", version, command, "imb",
                   "PingPong, Sendrecv: mean over a back-to-back loop; collectives: the slowest rank's mean over a "
                   "back-to-back loop (t_max)", "mpi", tuple(points), world=largest or None, date=date,
                   skipped=tuple(skipped))


def _header(path: Path, i: int, line: str) -> list[str]:
    """A table's column names, or the one-line error for a header without #bytes and a time column (t_max[usec],
    or PingPong's t[usec])."""
    header = line.split()
    if header[0] != "#bytes" or not {"t_max[usec]", "t[usec]"} & set(header):
        raise fail(path, i, f"IMB table header {' '.join(header)!r} lacks a #bytes or a t_max[usec] or t[usec] "
                            "column")
    return header


def _row(path: Path, i: int, line: str, header: list[str], name: str, op: str, procs: int,
         types: dict) -> list[PeerPoint]:
    """One table row as a point (none for the 0-byte row, which has no bytes to fit)."""
    if procs < 1:
        raise fail(path, i, f"IMB {name} row before its '#processes' line")
    cells = line.split()
    if len(cells) != len(header):
        raise fail(path, i, f"expected {len(header)} columns ({' '.join(header)}), found {len(cells)}")
    row = dict(zip(header, cells))
    key = "t_max[usec]" if "t_max[usec]" in row else "t[usec]"
    size = whole(path, i, row["#bytes"], "#bytes")
    if size == 0:
        return []
    seconds = number(path, i, row[key], key, "> 0") * 1e-6
    dtype = types["reduce"] if op in REDUCTIONS else types["data"]
    return [PeerPoint(op, procs, mpi_total_bytes(op, size, procs, "imb"), dtype, seconds, i)]
