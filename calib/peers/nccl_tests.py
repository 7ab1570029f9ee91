"""nccl-tests output: the text table (common.cu/util.cu's print format) and the -J JSON file (version 3).

Each row has an out-of-place and an in-place half (time in us, algbw, busbw, #wrong); the out-of-place half is
read unless in_place is asked for. The time is each rank's mean over a back-to-back loop of `iters` launches,
averaged over ranks (the default -a 1; -a 3 takes the maximum). With -I, the JSON file adds each iteration's time
(the maximum over processes), which become the point's samples. Sizes are totals (the whole gathered or sent
buffer), commcal's convention already. Ranks and their hosts come from the '#  Rank N Group G Pid P on HOST
device ...' lines (JSON: config.devices)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from calib.peers.model import Job, PeerLog, PeerPoint, fail, number, whole
from microbench.limits import MAX_COUNT, MAX_SECONDS

TESTS = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reduce_scatter",
         "alltoall": "alltoall", "broadcast": "bcast", "reduce": "reduce", "sendrecv": "sendrecv"}
"""nccl-tests binaries (<name>_perf) commcal has an operation for."""
DTYPES = {"int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32", "int64": "int64",
          "uint64": "uint64", "half": "float16", "float": "float32", "double": "float64", "bfloat16": "bfloat16",
          "f8e4m3": "fp8_e4m3", "f8e5m2": "fp8_e5m2"}
RANK = re.compile(r"^#\s+Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device")
STARTING = re.compile(r"^# Collective test starting: (\S+)")
VERSION = re.compile(r"^# nccl-tests version (\S+)")
WRONG = ("#wrong", "error")
STATISTIC = "mean over a back-to-back loop of launches, averaged over ranks (nccl-tests time)"
PER_ITERATION = "median over iterations of each iteration's slowest process (nccl-tests -I)"

START = re.compile(r"^# nThread ")
"""The line a run's text output begins with."""


def _op(path: Path, line: int, program: str) -> str:
    """'./build/all_reduce_perf' -> 'allreduce', or the one-line error."""
    name = Path(program).name.removesuffix("_perf").removesuffix("_mpi")
    if name not in TESTS:
        raise fail(path, line, f"nccl-tests test {Path(program).name!r} has no commcal operation (import one of: "
                               f"{', '.join(f'{n}_perf' for n in TESTS)})")
    return TESTS[name]


def _column_names(tokens: list[str]) -> bool:
    """Whether a '#' line names the table's columns: 'size count type ...' (the 'bytes N type ...' of old
    releases)."""
    return tokens[:2] in (["size", "count"], ["bytes", "N"])


def _dtype(path: Path, line: int, name: str) -> str:
    if name not in DTYPES:
        raise fail(path, line, f"unknown nccl-tests data type {name!r}")
    return DTYPES[name]


def read_text(path: Path, text: str, job: Job) -> PeerLog | None:
    """The nccl-tests table in `text`, or None when `text` has no nccl-tests header."""
    lines = text.splitlines()
    if not any(START.search(line) or "out-of-place" in line for line in lines):
        return None
    op, version, hosts, names, points = None, "unknown", {}, None, []
    header_at = 1
    for i, raw in enumerate(lines, 1):
        line = raw.strip()
        if (m := STARTING.match(line)) is not None:
            op = _op(path, i, m.group(1))
        elif (m := VERSION.match(line)) is not None:
            version = m.group(1)
        elif (m := RANK.match(line)) is not None:
            hosts[int(m.group(1))] = m.group(2)
        elif line.startswith("#") and _column_names(line.lstrip("#").split()):
            names, header_at = line.lstrip("#").split(), i
        elif line and not line.startswith("#") and names is not None:
            if op is None:
                raise fail(path, header_at, "nccl-tests log does not name its test (no '# Collective test "
                                            "starting:' line)")
            point = _text_row(path, i, line.split(), names, op, len(hosts), job.in_place)
            points += [point] if point is not None else []
    if names is None or not points:
        raise fail(path, header_at, "nccl-tests log with no result rows")
    ranks = tuple(hosts[r] for r in sorted(hosts))
    return PeerLog(str(path), "nccl-tests", version, "", "nccl-tests", STATISTIC, "nccl", tuple(points),
                   hosts=ranks, world=len(ranks) or None)


def _text_row(path: Path, i: int, cells: list[str], names: list[str], op: str, procs: int,
              in_place: bool) -> PeerPoint | None:
    """One result row; the time, #wrong of the out-of-place (or in-place) half; None for a row of 0 bytes (-b 0:
    no message to time)."""
    if procs < 1:
        raise fail(path, i, "nccl-tests result row before the '#  Rank ...' lines that say how many ranks ran")
    if len(cells) < len(names):
        raise fail(path, i, f"expected {len(names)} columns ({' '.join(names)}), found {len(cells)}")
    times = [k for k, n in enumerate(names) if n in ("time", "cputime")]
    wrongs = [k for k, n in enumerate(names) if n in WRONG]
    half = 1 if in_place else 0
    if len(times) <= half or len(wrongs) <= half:
        raise fail(path, i, f"no {'in-place' if in_place else 'out-of-place'} time and #wrong columns")
    size = whole(path, i, cells[0], "size")
    if size == 0:
        return None
    seconds = number(path, i, cells[times[half]], "time") * 1e-6
    wrong = cells[wrongs[half]]
    return PeerPoint(op, procs, size, _dtype(path, i, cells[2]), seconds, i,
                     wrong=0 if wrong == "N/A" else whole(path, i, wrong, "#wrong"))


def _positive(value) -> bool:
    """Whether a JSON value is a time in microseconds a run holds: above 0, at most MAX_SECONDS (an integer beyond
    would not fit a float)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= MAX_SECONDS * 1e6


def _count(value) -> bool:
    """Whether a JSON value is a whole number a reader can hold, 0 to MAX_COUNT (nccl-tests prints counts as floats)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT and \
        value == int(value)


def _hosts(path: Path, config) -> tuple[str, ...]:
    """Each rank's host, in rank order, from an nccl-tests JSON's config.devices, or the one-line error: every rank
    once, each with its host (a host missing or two devices of one rank would place ranks wrongly)."""
    devices = config.get("devices") if isinstance(config, dict) else None
    if not devices:
        raise fail(path, 1, "nccl-tests JSON without config.devices (the ranks that ran)")
    if not isinstance(devices, list) or not all(isinstance(d, dict) and _count(d.get("rank", 0))
                                                and isinstance(d.get("hostname"), str) and d["hostname"]
                                                for d in devices):
        raise fail(path, 1, "nccl-tests JSON's config.devices is not a list of objects with a whole rank and a "
                            "hostname")
    ranks = sorted(int(d.get("rank", 0)) for d in devices)
    if ranks != list(range(len(devices))):
        raise fail(path, 1, f"nccl-tests JSON's config.devices gives ranks {ranks[:8]}, not 0 to {len(devices) - 1} "
                            "once each")
    return tuple(d["hostname"] for d in sorted(devices, key=lambda d: d.get("rank", 0)))


def _list(path: Path, doc: dict, key: str, what: str) -> list:
    """doc[key] as a list (absent or null: empty), or the one-line error."""
    value = doc.get(key)
    if not isinstance(value, (list, type(None))):
        raise fail(path, 1, f"nccl-tests JSON's {key!r} is not a list ({what})")
    return value or []


def read_json(path: Path, text: str, job: Job) -> PeerLog | None:
    """The results of an nccl-tests -J file, or None when `text` is not one."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        line = getattr(exc, "lineno", 0)
        if '"nccl_version"' in text or '"results"' in text:
            raise fail(path, line, f"truncated or corrupt nccl-tests JSON ({exc})") from None
        return None
    if not isinstance(doc, dict) or "results" not in doc or "args" not in doc:
        return None
    if doc.get("version") != 3:
        raise fail(path, 1, f"nccl-tests JSON version {doc.get('version')!r}; commcal reads version 3")
    args = [str(a) for a in _list(path, doc, "args", "the command that names the test")]
    if not args:
        raise fail(path, 1, "nccl-tests JSON without 'args' (the command that names the test)")
    op = _op(path, 1, args[0])
    hosts = _hosts(path, doc.get("config"))
    half = "in_place" if job.in_place else "out_of_place"
    points, per_iteration = [], False
    for k, row in enumerate(_list(path, doc, "results", "one object per size")):
        result = row.get(half) if isinstance(row, dict) else None
        if not isinstance(result, dict):
            raise fail(path, 1, f"results[{k}] has no {half} object")
        seconds = result.get("time", result.get("cpu_time"))
        if not _positive(seconds) or isinstance(row.get("size"), bool) or not isinstance(row.get("size"), int):
            raise fail(path, 1, f"results[{k}] lacks a numeric size or a {half}.time above 0 "
                                f"(at most {MAX_SECONDS:g} s)")
        per_iter = row.get(f"{half}_per_iter") or {}
        times = per_iter.get("times_us") if isinstance(per_iter, dict) else None
        if not isinstance(times or [], list) or not all(_positive(t) for t in times or []):
            raise fail(path, 1, f"results[{k}].{half}_per_iter.times_us is not a list of times above 0 "
                                f"(at most {MAX_SECONDS:g} s)")
        samples = tuple(float(t) * 1e-6 for t in times or ())
        if row["size"] == 0:   # nccl-tests' -b 0 row: no message to time, as OSU and IMB's size 0
            continue
        per_iteration |= bool(samples)
        wrong = result.get("nwrong", 0)
        if not _count(wrong):
            raise fail(path, 1, f"results[{k}].{half}.nwrong {wrong!r} is not a count of wrong elements")
        points.append(PeerPoint(op, len(hosts), int(row["size"]), _dtype(path, 1, str(row.get("type"))),
                                float(seconds) * 1e-6, 1, samples, int(wrong)))
    if not points:
        raise fail(path, 1, "nccl-tests JSON with no results")
    nccl = doc.get("nccl_version")
    return PeerLog(str(path), "nccl-tests", f"NCCL {nccl}" if nccl else "unknown", " ".join(args), "nccl-tests",
                   PER_ITERATION if per_iteration else STATISTIC, "nccl", tuple(points), hosts=hosts,
                   world=len(hosts), date=str(doc.get("start_time", "")))
