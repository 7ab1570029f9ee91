"""OSU Micro-Benchmarks text output (osu_latency, osu_bw, osu_bibw and the blocking collectives, with or without -f).

OSU prints one table per run under a title '# OSU MPI[-CUDA|-ROCM] <name> Test v<version>'. It records neither
the process count nor the command line, so a collective's process count comes from the caller (--procs or --hosts);
the point-to-point tests run on exactly two processes.
Latency tests time a back-to-back loop: osu_latency's 'Avg Latency' is half the round trip averaged over the loop
(commcal's pingpong); a collective's 'Avg Latency' is each rank's loop average averaged over ranks, and with -f
'Max Latency' is the slowest rank's loop average, which is what is kept (commcal times the slowest rank too).
osu_bw and osu_bibw keep a window of messages in flight: their time per message (size / bandwidth, both
directions for bibw) has no per-message latency, so they are a method of their own ('osu-window')."""

from __future__ import annotations

import re
from pathlib import Path

from calib.peers.model import Job, PeerLog, PeerPoint, fail, mpi_total_bytes, number, whole

TITLE = re.compile(r"^# OSU MPI(?:-(CUDA|ROCM|OPENACC))? (.+?) Test v(\S+)\s*$")
TESTS = {"Latency": "pingpong", "Bandwidth": "pingpong", "Bi-Directional Bandwidth": "sendrecv",
         "Allreduce Latency": "allreduce", "Allgather Latency": "allgather", "Broadcast Latency": "bcast",
         "Reduce Latency": "reduce", "Reduce_scatter Latency": "reduce_scatter",
         "All-to-All Personalized Exchange Latency": "alltoall"}
"""OSU test titles commcal has an operation for (sizes of allgather and alltoall are per rank)."""
DTYPES = {"MPI_CHAR": "int8", "MPI_SIGNED_CHAR": "int8", "MPI_BYTE": "uint8", "MPI_INT": "int32",
          "MPI_FLOAT": "float32", "MPI_DOUBLE": "float64"}
BANDWIDTH = "Bandwidth (MB/s)"
LATENCY = ("Max Latency(us)", "Avg Latency(us)", "Latency (us)")
"""The latency columns in the order kept: the slowest rank's where -f prints it, else the average."""


def _header(path: Path, line: int, text: str) -> tuple[list[str], str]:
    """'# Size   Avg Latency(us)   Min Latency(us)' -> (['Size', 'Avg Latency(us)', 'Min Latency(us)'], the column
    kept: 'Avg Latency(us)'), or the one-line error for a header without a Size and a time or bandwidth column."""
    columns = re.split(r"\s{2,}", text.lstrip("#").strip())
    kept = next((c for c in (BANDWIDTH, *LATENCY) if c in columns), None)
    if columns[0] != "Size" or kept is None:
        raise fail(path, line, f"OSU table header {', '.join(columns)!r} lacks a Size column or a latency or "
                               "bandwidth column")
    return columns, kept


def read_text(path: Path, text: str, job: Job) -> PeerLog | None:
    """The OSU table in `text`, or None when `text` has no OSU title."""
    lines = text.splitlines()
    title = next(((i, m) for i, line in enumerate(lines, 1) if (m := TITLE.match(line.strip()))), None)
    if title is None:
        return None
    at, match = title
    device, name, version = match.groups()
    if name not in TESTS:
        raise fail(path, at, f"OSU test {name!r} has no commcal operation (import one of: "
                             f"{', '.join(f'{n} Test' for n in TESTS)})")
    op = TESTS[name]
    p2p = op in ("pingpong", "sendrecv")
    if not p2p and job.world is None:
        raise fail(path, at, "OSU does not record how many processes ran the collective: give --procs or --hosts")
    if not p2p and job.world < 2:
        raise fail(path, at, f"a collective of {job.world} process communicates with nobody: --procs or --hosts must "
                             "give the 2 or more processes that ran it")
    procs = 2 if p2p else job.world
    dtype, header, kept, points = "int8", None, None, []
    for i, raw in enumerate(lines[at:], at + 1):
        line = raw.strip()
        if line.startswith("# Datatype:"):
            dtype = DTYPES.get(line.split(":", 1)[1].strip().rstrip("."), dtype)
        elif line.startswith("# Size"):
            header, kept = _header(path, i, line)
        elif line and not line.startswith("#") and header is not None:
            cells = line.split()
            if len(cells) != len(header):
                raise fail(path, i, f"expected {len(header)} columns ({', '.join(header)}), found {len(cells)}")
            size = whole(path, i, cells[0], "size")
            if size == 0:
                continue
            value = dict(zip(header, cells))[kept]
            if kept == BANDWIDTH:
                seconds = size * (2 if op == "sendrecv" else 1) / (number(path, i, value, "bandwidth", "> 0") * 1e6)
            else:
                seconds = number(path, i, value, "latency", "> 0") * 1e-6
            points.append(PeerPoint(op, procs, mpi_total_bytes(op, size, procs), dtype, seconds, i))
    if header is None or not points:
        raise fail(path, at, f"OSU {name} Test with no measurements under its title")
    window = kept == BANDWIDTH
    if window:
        statistic = "size / bandwidth: time per message with a window of messages in flight" + \
                    (" in both directions" if op == "sendrecv" else "")
    elif kept == "Max Latency(us)":
        statistic = "slowest rank's mean over a back-to-back loop (OSU -f Max Latency)"
    else:
        statistic = "mean over a back-to-back loop" + ("" if p2p else " and over ranks (OSU Avg Latency)")
    return PeerLog(str(path), "osu", version, "", "osu-window" if window else "osu", statistic,
                   "mpi-cuda" if device == "CUDA" else "mpi", tuple(points), world=2 if p2p else None)
