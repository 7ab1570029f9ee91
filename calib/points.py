"""Reading sweep runs for the fit: every point's summary row joined with the median of its samples
(robust to outlying iterations; every visit weighing the same; of the fast speed where its calls ran at several),
plus each run's provenance. Reads through
microbench.records only."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from microbench import records
from microbench.errors import UsageError
from microbench.links import is_link
from microbench.ops import LOCAL_OPS, OPS, known_dtype
from microbench.provenance import SHARED_SWEEP, STEAL_WARN, recorded_sharing
from microbench.limits import MAX_BYTES, MAX_COUNT, MAX_SECONDS
from microbench.stats import SPEED_GAP, point_speeds
from microbench.switches import Topology
from microbench.threads import GPU_BACKENDS

_KEEP = ("run_id", "point_id", "backend", "op", "link", "nodes", "ranks_per_node", "procs", "requested_bytes",
         "size_bytes", "dtype", "flops", "wrong", "groups", "groups_per_node", "launches", "launch_spread")
SECONDS = (1e-12, MAX_SECONDS)
"""The samples a fit uses: times a timed call can take, a picosecond to 11.6 days. Samples outside (zero or negative
times, or absurd ones from a file edited by hand) are left out, and so are points left with none: the fit weighs each
point by 1/t^2, which floats do not hold far outside this range."""
CI = ("ci_low_s", "ci_high_s")
"""The 95% CI of each point's median, as the run recorded it (NaN where it has none); calib.regimes reads it."""
_COUNTS = ("nodes", "ranks_per_node", "procs", "groups", "groups_per_node")
_NUMBERS = (*_COUNTS, "requested_bytes", "size_bytes", "flops", "wrong")


@dataclass(frozen=True)
class RunSet:
    """The points of several runs (one row per run and point, `seconds` = median sample) and their run.json."""

    points: pd.DataFrame
    runs: tuple[dict, ...]
    notes: tuple[str, ...]            # warnings about the runs, one line each: points left out, CPU steal
    topology: dict | None = None      # the switch levels the runs measured on (run.json topology); None: flat


def _provenance(meta: dict, run_dir: Path, run_id: str) -> dict:
    """The calibration's view of a run.json (string fields; tolerant of keys a sweep did not record)."""
    def text(*keys):
        for k in keys:
            if meta.get(k) not in (None, ""):
                return str(meta[k]).replace("\x00", "").strip()
        return "unknown"

    hosts = meta.get("hosts")
    hosts = list(hosts) if isinstance(hosts, (list, dict)) else []
    versions = dict(meta.get("versions")) if isinstance(meta.get("versions"), dict) else {}
    if meta.get("mpi_standard_version"):
        versions["mpi_standard"] = meta["mpi_standard_version"]
    return {"run_id": run_id, "dir": str(run_dir), "date": text("start_time", "started_utc", "date"),
            "machine": text("machine", "hostname"), "hosts": [str(h) for h in hosts],
            "mpi_library": text("mpi_library_version", "mpi_library"),
            "versions": {str(k): str(v) for k, v in versions.items()},
            **records.conditions(meta.get("options", {}), f"{run_dir}/run.json"),
            **({"page_policy": advice} if (advice := records.page_advice(meta.get("page_policy"))) else {}),
            "method": records.timing_method(meta, f"{run_dir}/run.json"),
            **({"origin": meta["origin"]} if isinstance(meta.get("origin"), dict) else {}),
            **({"mpi_thread_level": level} if (level := _thread_level(meta)) else {}), **_sweep_path(meta),
            **({"cpu_sharing": share} if (share := recorded_sharing(meta.get("cpu_sharing"))) else {})}


def _sweep_path(meta: dict) -> dict:
    """A sweep's preset and launch count as the calibration keeps them (empty for imports and runs that predate the
    records: unknown)."""
    options, resumed = meta.get("options"), meta.get("resumed_at")
    if not isinstance(options, dict) or "quick" not in options or not isinstance(resumed, list):
        return {}
    return {"preset": "quick" if options["quick"] else "default", "launches": 1 + len(resumed)}


def _thread_level(meta: dict) -> dict | None:
    """run.json's mpi_thread_level as the calibration keeps it (requested and provided), None where the run does
    not record it (sweeps before it: mpi4py's default, multiple, was asked for)."""
    level = meta.get("mpi_thread_level")
    if not isinstance(level, dict):
        return None
    return {k: str(level.get(k, "unknown")) for k in ("requested", "provided")}


def _steal_warnings(meta: dict, run_dir: Path) -> list[str]:
    """One line per host whose recorded cpu_steal (run.json, since the sweep records it) exceeds STEAL_WARN."""
    steal = meta.get("cpu_steal")
    if not isinstance(steal, dict):
        return []
    return [f"{run_dir}: the hypervisor took {f:.0%} of {host}'s CPU time while it was measured (cpu_steal); its "
            f"times, intra-node ones most, are inflated: sweep again when the machine is quieter"
            for host, f in steal.items() if isinstance(f, (int, float)) and STEAL_WARN < f <= 1]


def _sharing_warnings(meta: dict, run_dir: Path) -> list[str]:
    """A line where run.json records more ranks than CPUs on one machine (cpu_sharing, since the sweep records it)."""
    share = recorded_sharing(meta.get("cpu_sharing"))
    if share is None:
        return []
    return [f"{run_dir}: {share['ranks']} ranks shared {share['cpus']} CPU(s) of one machine while it was measured "
            f"(cpu_sharing): {SHARED_SWEEP}"]


def _point_times(codes: np.ndarray, names: pd.Index, rounds: np.ndarray, seconds: np.ndarray) -> pd.DataFrame:
    """Per point (index: names[code]): `seconds`, its price (microbench.stats.point_speeds: the median of its
    samples with every visit (round) weighing the same, as the sweep's summary has it; where its calls split into
    speeds each held by a quarter of them or more, the fastest speed's median); `slow_ratio`, the median of the
    slower calls over that price (1.0: one speed); `minority_s` and `minority_ratio`, a faster minority speed and its
    slow ratio (NaN where none: microbench.stats.point_speeds); and `n_samples`. Runs store samples by point and
    round already; sorting happens only where they are not."""
    if not len(seconds):
        return pd.DataFrame({c: [] for c in ("seconds", "n_samples", "slow_ratio", "minority_s", "minority_ratio")},
                            index=pd.Index([], dtype=str))
    key = (codes.astype(np.int64) << 32) | rounds.astype(np.int64)
    if len(key) > 1 and (key[1:] < key[:-1]).any():
        order = np.argsort(key, kind="stable")
        key, seconds = key[order], seconds[order]
        del order
    visit_starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    point_of_visit = key[visit_starts] >> 32
    new_point = np.r_[True, point_of_visit[1:] != point_of_visit[:-1]]
    visits = np.split(seconds, visit_starts[1:])
    per_point = np.split(np.arange(len(visit_starts)), np.flatnonzero(new_point)[1:])
    speeds = [point_speeds([visits[v] for v in vs]) for vs in per_point]
    sizes = np.diff(np.r_[visit_starts[new_point], len(key)])
    minority = [m if m.median < p.median else None for p, m in speeds]
    return pd.DataFrame({"seconds": [p.median for p, _ in speeds], "n_samples": sizes,
                         "slow_ratio": [p.slow_ratio for p, _ in speeds],
                         "minority_s": [m.median if m else np.nan for m in minority],
                         "minority_ratio": [m.slow_ratio if m else np.nan for m in minority]},
                        index=pd.Index(names[point_of_visit[new_point]], dtype=str))


MAX_FLOPS = 1e30
"""The most floating-point operations a GEMM point may count (n = 1e10); beyond it a rate leaves the floats' range."""

BANDWIDTH_BOUND = 0.5
"""The share of a point's time its bytes take at its operation's sustained rate from which a point is bandwidth-bound
(calib.points.sustained_minorities)."""


def sustained_minorities(points: pd.DataFrame, after_idle: bool = False) -> pd.DataFrame:
    """`points` with each fast minority speed (`minority_s`) that moves its bytes no faster than the largest size of
    its operation, link and process count does priced (`seconds`, `slow_ratio`), the minority columns dropped. A
    minority at the largest size is sustained by definition (a burst is small beside it): an exchange's rendezvous
    overlapping in some calls and not in others. One faster than that is a burst: a token bucket's full bucket after
    an idle moment, which back-to-back traffic cannot keep up; its point keeps the quarter rule's price. So is a
    minority where the bytes at that rate take less than BANDWIDTH_BOUND of the point's time: in the latency regime
    a fast minority is a scheduling accident, not a transfer overlapping or not. Back to back (not after_idle), a point
    priced by the quarter rule at a speed faster than the largest size's is a burst too, priced at its slower speed;
    after idle time (sweep --after-gemm, --gap-ms) the bucket is full when a call starts and the burst is its price."""
    points = points.copy()
    minority = pd.to_numeric(points.pop("minority_s"), errors="coerce")
    ratio = pd.to_numeric(points.pop("minority_ratio"), errors="coerce")
    fastest = minority.fillna(points["seconds"])
    rate = points["size_bytes"] / fastest
    group = [points[c] for c in ("backend", "op", "link", "procs", "groups")]
    largest = points["size_bytes"].groupby(group).transform("max")
    sustained = rate.where(points["size_bytes"] == largest).groupby(group).transform("max")
    wire = points["size_bytes"] / sustained
    take = (minority.notna() & ~points["op"].isin(LOCAL_OPS) & (rate <= sustained * (1 + SPEED_GAP))
            & (wire >= BANDWIDTH_BOUND * points["seconds"]))
    points.loc[take, "seconds"] = minority[take]
    points.loc[take, "slow_ratio"] = ratio[take]
    # back to back (not after_idle: sweep --after-gemm or --gap-ms), the quarter rule's faster speed (slow_ratio > 1)
    # faces the same rate test: faster than the largest size, it is a burst that found the bucket full in a quarter of
    # the calls, and the point is priced at its slower speed; after idle time a burst is what a call meets
    burst = ((points["slow_ratio"] > 1) & ~take & ~points["op"].isin(LOCAL_OPS) & (not after_idle)
             & (points["size_bytes"] / points["seconds"] > sustained * (1 + SPEED_GAP)))
    points.loc[burst, "seconds"] = points.loc[burst, "seconds"] * points.loc[burst, "slow_ratio"]
    points.loc[burst, "slow_ratio"] = 1.0
    return points


def _usable(pts: pd.DataFrame, sampled: pd.Index, run_dir: Path) -> tuple[pd.DataFrame, list[str]]:
    """The points whose summary fields hold what the format says, whose results were right and that have positive
    samples (their ids in `sampled`, all in SECONDS); one line per reason others were left out."""
    pts = records.as_numbers(pts, _NUMBERS)
    counts = pd.concat([records.whole(pts[c], 1) for c in _COUNTS], axis=1).all(axis=1)
    counts &= pd.concat([pts[c] <= MAX_COUNT for c in _COUNTS], axis=1).all(axis=1)
    sizes = records.byte_sizes(pts["requested_bytes"]) & records.byte_sizes(pts["size_bytes"])
    pts, notes = records.screen(pts, [
        ("not a known operation", pts["op"].isin(list(OPS))),
        ("not a known backend", pts["backend"].isna() | pts["backend"].isin(["mpi", *GPU_BACKENDS])),
        ("not a link class", pts["link"].map(is_link)),
        ("no dtype", pts["dtype"].map(lambda v: isinstance(v, str))),
        ("a dtype of unknown size", pts["dtype"].map(known_dtype)),
        ("a process, node or group count that is not a whole number >= 1", counts),
        (f"a size that is not a positive number of bytes up to {MAX_BYTES:g}", sizes),
        ("no flop or wrong-element count", (pts["flops"] >= 0) & (pts["wrong"] >= 0)),
        (f"a GEMM whose flop count is not a number of 1 to {MAX_FLOPS:g}",
         ~pts["op"].eq("gemm") | pts["flops"].between(1, MAX_FLOPS)),
        ("wrong results", pts["wrong"] == 0),
        (f"without samples of {SECONDS[0]:g} to {SECONDS[1]:g} s in a numbered visit", pts["point_id"].isin(sampled))],
        run_dir)
    return pts.astype({c: "int64" for c in (*_COUNTS, "requested_bytes", "size_bytes", "wrong")}), notes


def _one_run(run_dir: Path) -> tuple[pd.DataFrame, dict, list[str], dict | None]:
    """(usable points, provenance, notes, the switch levels from run.json or None where flat or unrecorded)."""
    meta = records.read_run_json(run_dir)
    summary = records.load_summary(run_dir)
    try:
        samples = records.load_samples(run_dir, columns=["point_id", "time_s", "round"])
    except UsageError as exc:
        raise UsageError(f"{run_dir}: no samples to fit ({exc})") from None
    missing = [c for c in _KEEP if c not in summary.columns] + \
              [c for c in ("point_id", "time_s", "round") if c not in samples.columns]
    if missing:
        raise UsageError(f"{run_dir}: run files lack column {missing[0]!r}")
    if samples.empty:
        raise UsageError(f"{run_dir}: run holds no samples")
    times = pd.to_numeric(samples["time_s"], errors="coerce")
    rounds = pd.to_numeric(samples["round"], errors="coerce")
    visit = records.whole(rounds, 0) & (rounds < 2 ** 31)   # a visit number a sweep can write
    good = (times.between(*SECONDS) & visit).to_numpy()
    ids = samples["point_id"].astype("category")
    columns = [ids.cat.codes.to_numpy(), rounds.where(visit, 0).to_numpy().astype(np.int64), times.to_numpy()]
    del samples, times
    if not good.all():
        columns = [c[good] for c in columns]
    codes, rounds, seconds = columns
    stats = _point_times(codes, ids.cat.categories.astype(str), rounds, seconds)
    pts = summary.loc[:, list(_KEEP)].copy()
    for col in CI:
        pts[col] = pd.to_numeric(summary[col], errors="coerce") if col in summary.columns else np.nan
    pts["point_id"] = [str(v) for v in pts["point_id"]]
    pts, dropped = _usable(pts, stats.index, run_dir)
    if pts.empty:
        raise UsageError(f"{run_dir}: no point is usable ("
                         + "; ".join(note.removeprefix(f"{run_dir}: ") for note in dropped) + ")")
    pts = pts.join(stats, on="point_id", how="inner")
    run_id = str(meta.get("run_id") or pts["run_id"].iloc[0])
    pts["run_id"] = run_id
    backend = meta.get("backend") if isinstance(meta.get("backend"), str) else "mpi"
    pts["backend"] = pts["backend"].fillna(backend).astype(str)
    warnings = dropped + _steal_warnings(meta, run_dir) + _sharing_warnings(meta, run_dir)
    return pts, _provenance(meta, run_dir, run_id), warnings, _levels(meta, run_dir)


def _levels(meta: dict, run_dir: Path) -> dict | None:
    """run.json's topology where it has switch levels (sweeps since calibration version 14), else None (flat)."""
    topo = meta.get("topology")
    if not isinstance(topo, dict) or not topo.get("levels"):
        return None
    try:
        return Topology.from_json(topo).to_json()
    except (KeyError, TypeError, ValueError):
        raise UsageError(f"{run_dir}/run.json: malformed topology (expected source and levels[].groups)") from None


def check_pages(runs) -> None:
    """UsageError when the runs' host buffers had different huge-page advice (their timings differ by it)."""
    pages = sorted({r["page_policy"] for r in runs if "page_policy" in r})
    if len(pages) > 1:
        raise UsageError(f"runs mix {' and '.join(pages)} host buffers (sweep --page-policy); fit them separately")


def method(run: dict) -> str:
    """How a run's times were taken: its origin's method for imported peer logs (calib.peers), a sweep's --method
    (a reference mode shares the peer's name: `sweep --method osu` fits with imported OSU logs), else 'commcal'."""
    return str(run.get("origin", {}).get("method") or run.get("method") or "commcal")


def load_runs(run_dirs: list[str], backend: str | None = None, mix_methods: bool = False) -> RunSet:
    """All points of the given runs; UsageError on a bad directory, a mix of backends without --backend, or a mix
    of timing methods (a peer's loop mean is not commcal's median) unless mix_methods."""
    frames, runs, notes, topologies = [], [], [], {}
    seen: dict[str, str] = {}
    for d in run_dirs:
        pts, prov, why, topo = _one_run(Path(d))
        if prov["run_id"] in seen:
            raise UsageError(f"{seen[prov['run_id']]} and {d} hold the same run (run_id {prov['run_id']}): a run "
                             f"given twice would count its points twice; give it once")
        seen[prov["run_id"]] = d
        frames.append(pts)
        runs.append(prov)
        notes += why
        if topo is not None:
            topologies.setdefault(repr(topo["levels"]), (d, topo))
    if len(topologies) > 1:
        (a, _), (b, _) = list(topologies.values())[:2]
        raise UsageError(f"runs {a} and {b} were measured on different switch trees (run.json topology); fit them "
                         f"separately")
    caches, gaps, gemms = (sorted({r[name] for r in runs}) for name in ("cache", "gap_ms", "after_gemm"))
    if len(caches) > 1:
        raise UsageError(f"runs mix {' and '.join(caches)} buffers (sweep --cache); fit them separately")
    if len(gaps) > 1:
        raise UsageError(f"runs mix gaps of {' and '.join(f'{g:g}' for g in gaps)} ms before each call "
                         f"(sweep --gap-ms); fit them separately")
    if len(gemms) > 1:
        raise UsageError(f"runs mix GEMMs of N = {' and '.join(map(str, gemms))} before each call "
                         f"(sweep --after-gemm; 0: none); fit them separately")
    check_pages(runs)
    methods = sorted({method(r) for r in runs})
    if len(methods) > 1 and not mix_methods:
        raise UsageError(f"runs mix timing methods {' and '.join(methods)} (imported peer logs time otherwise than "
                         f"a sweep); fit them separately or pass --mix-methods")
    points = sustained_minorities(pd.concat(frames, ignore_index=True), after_idle=gemms[0] > 0 or gaps[0] > 0)
    backends = sorted(points["backend"].unique())
    if backend is None and len(backends) > 1:
        raise UsageError(f"runs mix backends {', '.join(backends)}; fit one at a time with --backend")
    chosen = backend or backends[0]
    points = points[points["backend"] == chosen]
    if points.empty:
        raise UsageError(f"no points for backend {chosen!r} (runs hold {', '.join(backends)})")
    comm = points[~points["op"].isin(LOCAL_OPS)]
    mixed = comm.groupby(["link", "procs"])["groups"].nunique()
    if (mixed > 1).any():
        link, procs = mixed[mixed > 1].index[0]
        raise UsageError(f"runs mix concurrent and one-group measurements of {link} at {procs} ranks; fit them "
                         f"separately")
    mixed = points[points["op"].isin(LOCAL_OPS)].groupby(["op", "dtype"])["groups"].nunique()
    if (mixed > 1).any():
        op, dtype = mixed[mixed > 1].index[0]
        raise UsageError(f"runs mix concurrent and one-rank {op} measurements of {dtype}; fit them separately")
    for col in ("procs", "nodes", "ranks_per_node", "requested_bytes", "size_bytes", "groups", "groups_per_node"):
        points[col] = points[col].astype("int64")
    topology = next(iter(topologies.values()))[1] if topologies else None
    return RunSet(points.reset_index(drop=True), tuple(runs), tuple(notes), topology)
