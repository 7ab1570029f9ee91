"""The on-disk format of a sweep run directory: the contract between microbench (writer) and calib,
reports (readers). Pure: pandas/pyarrow only.

A run directory holds:
  run.json                    provenance (schema "commcal.run", version RUN_SCHEMA_VERSION)
  points/<point_id>.json      one finished point's summary record (written last, atomically: its
                              presence means the point is complete)
  points/<point_id>.parquet   that point's samples (one row per timed iteration)
  summary.parquet, summary.csv, samples.parquet
                              every point consolidated, written when the sweep ends; readers fall
                              back to points/ for a run that was killed before that.

Size conventions (nccl-tests): `size_bytes` is the whole buffer each rank passes for allreduce,
bcast and reduce; the whole gathered (receive) buffer for allgather; the whole send buffer for
reduce_scatter and alltoall; the message for pingpong and sendrecv (each direction); one square
operand for gemm. algbw = size_bytes / median_s; busbw = algbw * bus_factor(op, p), and
bytes_per_rank = size_bytes * bus_factor(op, p) is what an optimal algorithm sends per rank.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from microbench.errors import UsageError
from microbench.jsonfile import directory_kind, input_path, read_json
from microbench.limits import MAX_BYTES, MAX_COUNT, MAX_GEMM
from microbench.methods import METHODS

RUN_SCHEMA = "commcal.run"
RUN_SCHEMA_VERSION = 1



@dataclass(frozen=True)
class PointKey:
    """What identifies a measurement point; resume skips keys already on disk."""

    backend: str
    op: str
    link: str
    procs: int
    requested_bytes: int
    dtype: str
    groups: int = 1          # groups measured at once (sweep --concurrent)

    @property
    def point_id(self) -> str:
        tail = f"-x{self.groups}" if self.groups > 1 else ""
        return f"{self.backend}-{self.op}-{self.link}-p{self.procs}-{self.requested_bytes}B-{self.dtype}{tail}"


@dataclass(frozen=True)
class PointSummary:
    """One row of summary.parquet / summary.csv. Times in seconds, bandwidths in bytes per second."""

    run_id: str
    point_id: str
    backend: str
    op: str
    link: str
    nodes: int
    ranks_per_node: int
    procs: int
    requested_bytes: int
    size_bytes: int          # actual, after rounding the element count to the layout (see module doc)
    count: int               # elements per rank's send buffer
    dtype: str
    bytes_per_rank: float
    in_place: bool
    timing_path: str         # "c" (compiled loop) or "python"
    samples: int
    median_s: float
    ci_low_s: float
    ci_high_s: float
    min_s: float
    p95_s: float
    mean_s: float
    target_ci: float
    target_met: bool
    algbw_Bps: float
    busbw_Bps: float
    wrong: int               # elements that differed from the expected result in check iterations
    flops: float             # per iteration for gemm, 0 otherwise
    flops_per_s: float       # flops / median_s for gemm, 0 otherwise
    groups: int = 1          # disjoint groups of this shape measured at once (sweep --concurrent), max over them
    groups_per_node: int = 1  # the most of those groups with ranks on one node (they share its network link)
    rounds: int = 1          # visits pooled into this point, each in another pass over the sweep (time window)
    round_spread: float = 0.0  # half the range of the visits' medians, relative to the median: drift between
                               # time windows, which the CI of the pooled samples does not see
    launches: int = 1        # MPI launches (a run and its resumptions) whose visits are pooled into this point
    launch_spread: float = 0.0  # half the range of the launches' medians, relative to the median: modes an MPI
                                # library picks per launch (protocol, placement), which one launch cannot see

    @property
    def ci_rel_half_width(self) -> float:
        """The median CI's larger distance from the median, relative to it (inf without a CI)."""
        if not (self.median_s > 0 and math.isfinite(self.ci_low_s) and math.isfinite(self.ci_high_s)):
            return math.inf
        return max(self.ci_high_s - self.median_s, self.median_s - self.ci_low_s) / self.median_s

    def to_dict(self) -> dict:
        return asdict(self)


SUMMARY_COLUMNS = tuple(PointSummary.__dataclass_fields__)
ADDED_COLUMNS = {"groups": 1, "groups_per_node": 1, "rounds": 1, "round_spread": 0.0, "launches": 1,
                 "launch_spread": 0.0}
"""Summary columns added after the first runs were written, with the value those runs meant."""
SAMPLE_COLUMNS = ("run_id", "point_id", "iteration", "time_s", "round", "launch")
"""samples: time_s is one timed iteration, the max over the participating ranks; round is the visit (0-based)
it was taken in, launch the MPI launch (0: the run's first, k: its k-th resumption). Runs written before either
read as 0."""
ADDED_SAMPLE_COLUMNS = ("round", "launch")


def conditions(options: dict, where: str = "run.json") -> dict:
    """The conditions a run's calls were timed in, from run.json's options: buffer cache mode (runs from before
    the choice reused warm buffers), the idle gap before each call in ms and the N of the N x N GEMM run before
    each call (before these: none). Runs that differ in these neither resume nor fit together."""
    try:
        found = {"cache": str(options.get("cache", "warm")), "gap_ms": float(options.get("gap_ms", 0.0)),
                 "after_gemm": int(options.get("after_gemm", 0))}
    except (AttributeError, TypeError, ValueError, OverflowError):
        found = None
    if found is None or found["cache"] not in ("cold", "warm") or not 0 <= found["gap_ms"] < math.inf \
            or not 0 <= found["after_gemm"] <= MAX_GEMM:
        raise UsageError(f"{where}: key 'options' does not hold a sweep's options (cache cold or warm, gap_ms >= 0, "
                         f"after_gemm 0..{MAX_GEMM})")
    return found


def timing_method(meta: dict, where: str = "run.json") -> str:
    """How a run's times were taken (microbench.methods): an imported peer log's origin method, a sweep's --method,
    or 'commcal' (sweeps before --method); a name none of those is (no writer of ours gives one) is a UsageError
    naming `where`."""
    origin, options = meta.get("origin"), meta.get("options")
    if isinstance(origin, dict) and origin.get("method"):
        found, key = origin["method"], "origin"
    else:
        found, key = (options.get("method") if isinstance(options, dict) else None) or "commcal", "options"
    if not isinstance(found, str) or found not in METHODS:
        raise UsageError(f"{where}: key '{key}' names the timing method {str(found)[:40]!r}, not one of "
                         f"{', '.join(METHODS)}")
    return found


def page_advice(policy: str | None) -> str | None:
    """'hugepage' or 'nohugepage', the advice a run.json's page_policy (buffers.set_page_policy's answer) put
    in force on numpy's buffers; None when it does not say."""
    for advice in ("nohugepage", "hugepage"):
        if policy in (advice, f"numpy-default ({advice})"):
            return advice
    return None


def read_run_json(run_dir: str | Path) -> dict:
    return read_meta(input_path(run_dir) / "run.json", RUN_SCHEMA, RUN_SCHEMA_VERSION, "a commcal run directory")


def read_meta(path: Path, schema: str, version: int, what: str) -> dict:
    """A directory's provenance JSON (`path`), checked to hold an object of `schema` at `version`; `what` names
    the directory a missing file means this is not."""
    if not path.is_file():
        other = directory_kind(path.parent)
        raise UsageError(f"{path.parent}: not {what} (no {path.name})" + (f": {other}" if other else ""))
    meta = read_json(path, path.name, finite=False)
    if not isinstance(meta, dict):
        raise UsageError(f"{path}: {path.name} must hold a JSON object, not {type(meta).__name__}")
    if meta.get("schema") != schema or meta.get("version") != version:
        if directory_kind(path.parent) == "a validation directory":
            raise UsageError(f"{path.parent}: not {what}: a validation directory")
        raise UsageError(f"{path}: schema {meta.get('schema')!r} version {meta.get('version')!r} is not "
                         f"{schema!r} version {version}")
    return meta


def read_parquet(path: Path, columns: list[str] | None = None, categorical: bool = False) -> pd.DataFrame:
    """Read a Parquet file; `categorical` keeps repeated strings (sample ids) compact in memory."""
    try:
        return pq.read_table(path, columns=columns).to_pandas(strings_to_categorical=categorical)
    except Exception as exc:  # pyarrow raises several types for corrupt or truncated files
        raise UsageError(f"{path}: corrupt or truncated Parquet file ({type(exc).__name__})") from None


def load_summary(run_dir: str | Path) -> pd.DataFrame:
    """Every finished point's summary row; from summary.parquet, or from points/ if the run was cut short."""
    run_dir = input_path(run_dir)
    read_run_json(run_dir)
    consolidated = run_dir / "summary.parquet"
    if consolidated.is_file():
        summary = read_parquet(consolidated)
        if summary.empty:
            raise UsageError(f"{run_dir}: run holds no finished points")
        return _complete(summary)
    rows = []
    for f in sorted((run_dir / "points").glob("*.json")):
        rows.append(read_json(f, "point record", finite=False))
        if not isinstance(rows[-1], dict):
            raise UsageError(f"{f}: corrupt point record (not a JSON object)")
    if not rows:
        raise UsageError(f"{run_dir}: run holds no finished points")
    return _complete(pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS)))


def _complete(summary: pd.DataFrame) -> pd.DataFrame:
    """Fill the ADDED_COLUMNS an older run lacks (or holds no number in)."""
    for col, value in ADDED_COLUMNS.items():
        if col not in summary:
            summary[col] = value
            continue
        numbers = pd.to_numeric(summary[col], errors="coerce")
        if isinstance(value, int):   # a count no integer holds (inf, 1e300): -1, which the readers' screens leave out
            numbers = numbers.where(numbers.isna() | numbers.abs().le(MAX_COUNT), -1)
        summary[col] = numbers.fillna(value).astype(type(value))
    return summary


def as_numbers(summary: pd.DataFrame, columns) -> pd.DataFrame:
    """A copy of `summary` with `columns` as floats: a value of another type (a string, a list, null: what a point
    record edited by hand may hold) becomes NaN, which a reader's checks (screen) then leave out."""
    out = summary.copy()
    for col in columns:
        out[col] = pd.to_numeric(out[col], errors="coerce").astype(float)
    return out


def whole(values: pd.Series, least: int) -> pd.Series:
    """Which values are whole numbers >= least (NaN and infinity are not)."""
    return (values >= least) & (values % 1 == 0)


def byte_sizes(values: pd.Series) -> pd.Series:
    """Which values are sizes in bytes a reader can hold: above 0 and at most MAX_BYTES."""
    return (values > 0) & (values <= MAX_BYTES)


def positive(values: pd.Series) -> pd.Series:
    """Which values are finite numbers above 0."""
    return (values > 0) & (values < math.inf)


def points_note(where, summary: pd.DataFrame, rows: pd.Series, what: str) -> str:
    """One line saying what happened to the points of `rows` (a mask), naming up to three."""
    ids = [str(v) for v in summary.loc[rows, "point_id"]]            # a missing id (NaN) named as such
    return f"{where}: {len(ids)} point(s) {what}: {', '.join(ids[:3])}" + (", ..." if len(ids) > 3 else "")


def screen(summary: pd.DataFrame, checks: list[tuple[str, pd.Series]], where) -> tuple[pd.DataFrame, list[str]]:
    """The rows of `summary` that pass every check (why a row fails it, mask of the rows that pass), and one line per
    check that failed rows (a row counts under the first check it fails)."""
    keep = pd.Series(True, index=summary.index)
    notes = []
    for why, ok in checks:
        out = keep & ~ok.astype(bool)
        if out.any():
            notes.append(points_note(where, summary, out, f"left out, {why}"))
        keep &= ~out
    return summary[keep], notes


def load_samples(run_dir: str | Path, columns: list[str] | None = None) -> pd.DataFrame:
    """Every timed iteration of every finished point (columns SAMPLE_COLUMNS, or the ones asked for)."""
    run_dir = Path(run_dir)
    read_run_json(run_dir)
    consolidated = run_dir / "samples.parquet"
    if consolidated.is_file():
        return _with_added(consolidated, columns)
    done = {f.stem for f in (run_dir / "points").glob("*.json")}
    frames = [_with_added(run_dir / "points" / f"{pid}.parquet", columns) for pid in sorted(done)]
    if not frames:
        raise UsageError(f"{run_dir}: run holds no samples")
    return pd.concat(frames, ignore_index=True)


def _with_added(path: Path, columns: list[str] | None) -> pd.DataFrame:
    """Read samples, giving files written before them the ADDED_SAMPLE_COLUMNS (0)."""
    wanted = list(SAMPLE_COLUMNS if columns is None else columns)
    if not set(ADDED_SAMPLE_COLUMNS) & set(wanted):
        return read_parquet(path, wanted, categorical=True)
    try:
        names = set(pq.read_schema(path).names)
    except Exception:  # the read below names the corrupt file
        names = set(wanted)
    missing = [c for c in ADDED_SAMPLE_COLUMNS if c in wanted and c not in names]
    frame = read_parquet(path, [c for c in wanted if c not in missing], categorical=True)
    for col in missing:
        frame[col] = 0
    return frame[wanted]
