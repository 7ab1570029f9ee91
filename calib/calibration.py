"""The calibration file: the one loader (validates against calibration.schema.json, rejects unknown
versions, missing or unknown keys and wrong types with one line naming the key, and reads the file into
calib.result.CalibrationResult) and the predictions every consumer (predict, analysis, reports) makes from it."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
from jsonschema import Draft202012Validator

from calib.algorithms import P2P_OPS, algorithm, known_algorithms, piecewise_terms, segment_bounds
from calib.result import LAUNCH_WARN, SCHEMA, VERSION, CalibrationResult, Model, Speeds
from microbench.errors import UsageError
from microbench.jsonfile import input_path, read_json
from microbench.ops import known_dtype
from microbench.provenance import SHARED_SWEEP

READS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20)
"""Versions the loader accepts; what each added, and what its absence means: docs/calibration-format.md (9 added
provenance.runs[].origin, the peer logs a run was imported from; absent: a commcal sweep; 10 added origin.spec,
a calibration written from a hardware spec, and compute.memory_bytes; absent: device memory unknown; 11 added
provenance.runs[].method and provenance.runs[].mpi_thread_level; absent: commcal's method, thread level unknown;
12 added models[op][link].launch_spread, provenance.runs[].preset and .launches; absent: no point measured in more
than one MPI launch, preset and launches unknown; 13 added compute.gemm.*.wave_tiles,
tile_rows and tile_cols; absent: no wave quantization; 14 added topology, the switch levels, and the link classes
inter2..inter9; absent: flat, one inter level; 15 added models[op][link].source, compute.gemm.*.source and
compute.copy.source, where each came from in a spec refined by measurements; absent: every run of the provenance; 16
added models[op][link].speeds, the points whose calls ran at several speeds, priced at the fastest held by a quarter
to a half of their calls; absent: every point priced at its pooled median; 17 counts in speeds every point whose calls
split into speeds each held by a quarter of them or more, priced at the fastest, and its max_ratio is the slower
calls' median over the price, where 16 priced and counted only a fastest speed held by less than half and divided the
pooled median; 18 also prices a bandwidth-bound point's fast minority, held by a twentieth of its calls and two
calls, where it moves its bytes no faster than its operation's largest size does (calib.points.sustained_minorities),
where 17 asked a quarter; 19 adds speeds.sizes and speeds.ratios, the slow-over-price ratio at each size; absent: only
max_ratio, wherever it was seen; 20 adds provenance.runs[].cpu_sharing, where a sweep's ranks outnumbered a machine's
CPUs; absent: a CPU per rank, or unknown)."""
SCHEMA_FILE = "calibration.schema.json"
Z95 = 1.959963984540054


@functools.cache
def json_schema() -> dict:
    """The published JSON Schema of the calibration file (calib/calibration.schema.json)."""
    return json.loads(resources.files("calib").joinpath(SCHEMA_FILE).read_text())


def _key(path, *more) -> str:
    return ".".join(str(p) for p in (*path, *more)) or "<top level>"


def _describe(err) -> str:
    """One line for a jsonschema error, naming the offending key."""
    path = list(err.absolute_path)
    kind = err.validator
    if kind == "required":
        missing = [k for k in err.validator_value if k not in err.instance]
        return f"missing key '{_key(path, missing[0])}'"
    if kind == "additionalProperties":
        allowed = set(err.schema.get("properties", {}))
        extra = sorted(k for k in err.instance if k not in allowed)
        return f"unknown key '{_key(path, extra[0])}'"
    if "propertyNames" in err.schema_path:
        return f"unknown key '{_key(path, err.instance)}'"
    if kind == "type":
        return f"key '{_key(path)}' must be of type {err.validator_value}, not {type(err.instance).__name__}"
    if kind in ("enum", "const"):
        allowed = err.validator_value if kind == "enum" else [err.validator_value]
        return f"key '{_key(path)}' is {err.instance!r}, expected one of {allowed}"
    return f"key '{_key(path)}': {err.message}"


def _non_finite(obj, path=()) -> str | None:
    """The key of the first NaN or infinity in a JSON-like value (JSON has neither), or None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return _key(path)
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        found = _non_finite(v, (*path, k))
        if found is not None:
            return found
    return None


def validate(data: object, where: str = "calibration") -> None:
    """Raise UsageError (one line naming the key) unless `data` is a valid calibration of this version."""
    if not isinstance(data, dict):
        raise UsageError(f"{where}: a calibration must be a JSON object, not {type(data).__name__}")
    if data.get("schema") != SCHEMA:
        raise UsageError(f"{where}: key 'schema' is {data.get('schema')!r}, expected {SCHEMA!r}")
    if data.get("version") not in READS:
        raise UsageError(f"{where}: key 'version' is {data.get('version')!r}: unsupported calibration version "
                         f"(this commcal reads versions {', '.join(map(str, READS))})")
    errors = list(Draft202012Validator(json_schema()).iter_errors(data))
    if errors:
        first = min(errors, key=lambda e: (len(e.absolute_path), [str(p) for p in e.absolute_path]))
        raise UsageError(f"{where}: {_describe(first)}")
    bad = _non_finite(data)
    if bad is not None:
        raise UsageError(f"{where}: key '{bad}' is not a finite number")
    for dtype in data.get("compute", {}).get("gemm", {}):
        if not known_dtype(dtype):
            raise UsageError(f"{where}: key 'compute.gemm.{dtype}' names no element type commcal knows "
                             f"(float32, float64, float16, bfloat16, ...)")
    for op, by_link in data["models"].items():
        for link in by_link:
            if link not in data["link_classes"]:
                raise UsageError(f"{where}: key 'models.{op}.{link}' is a model on link class {link!r}, which "
                                 f"'link_classes' lacks (has: {', '.join(data['link_classes']) or 'none'})")
    for key, models in model_sets(data):
        for op, by_link in models.items():
            for link, model in by_link.items():
                _check_model(f"{where}: key '{key}.{op}.{link}", model)


def _check_model(named: str, model: dict) -> None:
    """UsageError unless one model's algorithm is known, its segments ascend (predictions pick a segment by the
    sizes between them) and its speeds give one ratio per ascending size; `named` opens the line."""
    if model["algorithm"] not in known_algorithms():
        raise UsageError(f"{named}.algorithm' is {model['algorithm']!r}, expected one of {list(known_algorithms())}")
    segments = model["segments"]
    for i, seg in enumerate(segments):
        earlier = segments[i - 1] if i else seg
        if not earlier["min_bytes"] <= seg["min_bytes"] <= seg["max_bytes"] or seg["max_bytes"] < earlier["max_bytes"]:
            raise UsageError(f"{named}.segments.{i}' spans {seg['min_bytes']:g}..{seg['max_bytes']:g} B: a segment's "
                             "min_bytes must not exceed its max_bytes, and each segment must start and end at or above "
                             "the one before (smallest first)")
    speeds = model.get("speeds", {})
    if len(speeds.get("sizes", ())) != len(speeds.get("ratios", ())) \
            or list(speeds.get("sizes", ())) != sorted(speeds.get("sizes", ())):
        raise UsageError(f"{named}.speeds': sizes must ascend and ratios give one ratio per size")


def model_sets(data: dict) -> list[tuple[str, dict]]:
    """(key, {op: {link: model}}) of the main models and, where the file has them, the after-compute ones."""
    after = data.get("after_compute")
    return [("models", data["models"])] + ([("after_compute.models", after["models"])] if after else [])


@dataclass(frozen=True)
class Prediction:
    """A predicted time with its 95% prediction interval, and whether it left the measured range."""

    seconds: float
    low_s: float
    high_s: float
    extrapolated: bool
    model: str
    link: str
    note: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class _Piecewise:
    """One (op, link) model as arrays, for fast vectorised prediction."""

    algorithm: str
    bounds: np.ndarray          # nbytes at which segment i+1 takes over (geometric mid between segments)
    alpha: np.ndarray
    beta: np.ndarray
    var_alpha: np.ndarray
    var_beta: np.ndarray
    cov: np.ndarray
    rel_sd: np.ndarray
    min_bytes: float
    max_bytes: float
    procs: tuple[int, ...]
    identifiable: bool

    @classmethod
    def of(cls, model: Model) -> "_Piecewise":
        segs = model.segments
        col = lambda key: np.array([getattr(s, key) for s in segs], dtype=float)  # noqa: E731
        with np.errstate(over="ignore"):     # a file's huge standard errors: infinite variances, infinite intervals
            return cls(model.algorithm, segment_bounds(col("max_bytes"), col("min_bytes")), col("alpha_s"),
                       col("beta_s_per_byte"), col("alpha_se_s") ** 2, col("beta_se_s_per_byte") ** 2,
                       col("cov_alpha_beta_s2_per_byte"), col("rel_resid_sd"), float(segs[0].min_bytes),
                       float(segs[-1].max_bytes), tuple(model.procs_measured), bool(model.identifiable))

    def terms(self, op: str, procs: int, nbytes: np.ndarray):
        """(seconds, segment index, a, b*n) for each size; p2p operations ignore procs."""
        return piecewise_terms(algorithm(self.algorithm), self.bounds, self.alpha, self.beta,
                               2 if op in P2P_OPS else procs, nbytes)


@dataclass(frozen=True, eq=False)
class Calibration:
    """A validated calibration file (`data`, the JSON; `result`, the same as calib.result.CalibrationResult) and the
    predictions made from it."""

    data: dict
    path: str | None = None
    result: CalibrationResult = field(init=False, repr=False)
    backend: str = field(init=False)
    _models: dict = field(init=False, repr=False)
    _after: dict = field(init=False, repr=False)

    def __post_init__(self) -> None:
        result = CalibrationResult.from_json(self.data)
        object.__setattr__(self, "result", result)
        object.__setattr__(self, "backend", result.backend)
        sets = [{key: _Piecewise.of(m) for key, m in models.items()} for _, models in result.model_sets()]
        object.__setattr__(self, "_models", sets[0])
        object.__setattr__(self, "_after", sets[1] if len(sets) > 1 else {})

    @property
    def after_gemm(self) -> int:
        """N of the GEMM before each call of the sweeps behind the after-compute models (0: none)."""
        return self.result.after_gemm

    @property
    def page_policy(self) -> str | None:
        """The huge-page advice ('hugepage' or 'nohugepage') the sweeps' host buffers had; None when unknown
        (calibrations before version 8)."""
        return next((r["page_policy"] for r in self.result.provenance["runs"] if "page_policy" in r), None)

    def path_advice(self) -> tuple[str, ...]:
        """One line per way this calibration was made that is known to rank strategies worse than the default path
        (docs/methodology.md, "The default path"): a quick preset, sweeps that measured between nodes in one MPI
        launch only, or no after-compute models; sweeps whose ranks outnumbered a machine's CPUs; models whose points
        moved between launches (a validate's launch may meet either speed); and models priced at the fast one of
        several speeds.
        Empty where the provenance does not say (older files, imports, specs)."""
        runs = self.result.provenance.get("runs", [])
        lines = []
        if any(r.get("preset") == "quick" for r in runs):
            lines.append("calibration from a quick sweep (sweep --quick, COMMCAL_PRESET=quick): the quick presets are "
                         "for trying commcal out and rank strategies worse; sweep with the defaults to validate")
        between_nodes = any(link != "intra" for _, link in self._models)
        if between_nodes and runs and all(r.get("launches") == 1 for r in runs):
            lines.append("every point was measured in one MPI launch: modes an MPI library picks per launch are not "
                         "in its prices (slurm/sweep.sh measures in two; docs/methodology.md#launches)")
        if not self._after and runs and all("after_gemm" in r for r in runs):
            lines.append("no after-compute models: a collective that follows a computation is priced as a call "
                         "back to back, which it is not (a link idle, caches cold); slurm/sweep.sh sweeps them by "
                         "default, or `fit RUN --after-compute RUN_AFTER` with a `sweep --after-gemm 384` run "
                         "(docs/methodology.md#after-compute-models)")
        moved = [(m.launch_spread.max, op, link, m.launch_spread) for (op, link), m in self.result.models.items()
                 if m.launch_spread is not None and m.launch_spread.max > LAUNCH_WARN]
        if moved:
            _, op, link, worst = max(moved)
            lines.append(f"{len(moved)} model(s) moved between MPI launches by more than {LAUNCH_WARN:.0%} (most: "
                         f"{op}/{link}, {worst.max:.0%} at {worst.max_at_bytes:g} B, {worst.max_at_procs} ranks): a "
                         "launch runs such points at one of their speeds, so a validate can miss their price by that "
                         "much however well the rest is priced (docs/methodology.md#launches)")
        shared = [r["cpu_sharing"] for r in runs if isinstance(r.get("cpu_sharing"), dict)]
        if shared:
            worst = max(shared, key=lambda s: s["ranks"] / s["cpus"])
            lines.append(f"swept with more ranks than CPUs ({worst['ranks']} ranks on {worst['cpus']} CPU(s) of one "
                         f"machine): {SHARED_SWEEP}")
        fast = [(m.speeds.max_ratio, op, link, m.speeds) for (op, link), m in self.result.models.items()
                if m.speeds is not None]
        if fast:
            _, op, link, worst = max(fast)
            lines.append(f"{len(fast)} model(s) priced some points at the fast one of several speeds their calls ran "
                         f"at (most: {op}/{link}, the slower calls {worst.max_ratio:.2f}x the price at "
                         f"{worst.max_at_bytes:g} B, {worst.max_at_procs} ranks): steps that draw the slow speeds run "
                         "up to that much over their price (docs/methodology.md#speeds)")
        return tuple(lines)

    def several_speeds(self) -> dict[tuple[str, str], tuple[Speeds, ...]]:
        """(op, link) -> the `speeds` of its models (back to back and after compute) that priced points at the fast
        one of several speeds; only the collectives that have such points."""
        after = self.result.after_compute
        out: dict[tuple[str, str], tuple[Speeds, ...]] = {}
        for key, m in [*self.result.models.items(), *(after.models.items() if after else ())]:
            if m.speeds is not None:
                out[key] = (*out.get(key, ()), m.speeds)
        return out

    def link_classes(self) -> dict[str, dict]:
        """name -> {"nodes", "ranks_per_node", "procs", "meaning", "shapes"}."""
        return {k: dict(v) for k, v in self.result.link_classes.items()}

    def switch_spans(self) -> tuple[int, ...]:
        """Nodes under one switch at each switch level (1 up), the fewest of any switch of that level, as a mesh
        places its nodes (analysis.mesh): () for a flat calibration (no topology, or one level)."""
        levels = (self.result.topology or {}).get("levels", [])
        if len(levels) < 2:
            return ()
        return tuple(min(len(g) for g in lv["groups"]) for lv in levels)

    def groups_per_node(self, link: str) -> int:
        """How many groups of `link` per node ran at once when it was measured (1 before sweep --concurrent)."""
        return int(self.result.link_classes.get(link, {}).get("groups_per_node", 1))

    def has(self, op: str, link: str) -> bool:
        return (op, link) in self._models

    def _model(self, op: str, link: str) -> _Piecewise:
        if (op, link) not in self._models:
            have = ", ".join(f"{o}/{l}" for o, l in sorted(self._models)) or "none"
            raise UsageError(f"calibration {self.path or ''} has no model for {op} on link {link!r} (has: {have})")
        return self._models[(op, link)]

    def _context_model(self, op: str, link: str, after_compute: bool) -> _Piecewise:
        """The after-compute model where asked for and present, else the main one."""
        if after_compute and (op, link) in self._after:
            return self._after[(op, link)]
        return self._model(op, link)

    def predict(self, op: str, link: str, procs: int, nbytes: float, after_compute: bool = False) -> Prediction:
        """Predicted seconds for one call, with a 95% prediction interval (parameter covariance plus the
        fit's relative scatter); says when procs or the size lie outside what was measured. after_compute: the
        call follows a local computation (priced by the after-compute model where the calibration has one)."""
        if procs < 1 or nbytes < 0 or not math.isfinite(nbytes):
            raise UsageError(f"predict needs procs >= 1 and a finite size >= 0 (got procs={procs}, bytes={nbytes})")
        m = self._context_model(op, link, after_compute)
        t, seg, a, bn = m.terms(op, procs, np.array([float(nbytes)]))
        t, i, bn = float(t[0]), int(seg[0]), float(bn[0])
        a = float(a)
        with np.errstate(over="ignore", invalid="ignore"):      # a file's huge variances: an infinite interval
            var = float(a * a * m.var_alpha[i] + bn * bn * m.var_beta[i] + 2 * a * bn * m.cov[i]
                        + (t * m.rel_sd[i]) ** 2)
        half = Z95 * math.sqrt(var) if var > 0 else (math.inf if math.isnan(var) else 0.0)
        notes = []
        extrapolated = False
        if op not in P2P_OPS and procs not in m.procs:
            extrapolated = True
            how = "" if m.identifiable else " (algorithm not identifiable from the process counts measured)"
            notes.append(f"procs {procs} not measured (measured {list(m.procs)}): extrapolated with the "
                         f"{m.algorithm} model{how}")
        if nbytes < m.min_bytes or nbytes > m.max_bytes:
            extrapolated = True
            notes.append(f"{nbytes:g} bytes outside the measured {m.min_bytes:g}..{m.max_bytes:g}")
        if after_compute and (op, link) in self._after:
            notes.append(f"after a local computation: the after-compute model (sweeps with a {self.after_gemm}x"
                         f"{self.after_gemm} GEMM before each call)")
        elif after_compute:
            notes.append(f"no after-compute model for {op} on {link}: the main model")
        if t < 0:
            notes.append(f"model gives {t:.3g} s; clipped to 0")
        return Prediction(max(t, 0.0), max(t - half, 0.0), max(t + half, 0.0), extrapolated, m.algorithm, link,
                          "; ".join(notes))

    def predict_seconds(self, op: str, link: str, procs: int, nbytes: np.ndarray,
                        after_compute: bool = False) -> np.ndarray:
        """Vectorised predicted seconds (no intervals, no notes), clipped at 0."""
        t, _, _, _ = self._context_model(op, link, after_compute).terms(op, procs, np.asarray(nbytes, dtype=float))
        return np.maximum(t, 0.0)

    def gemm_flops_per_s(self, dtype: str) -> float:
        rates = self.result.gemm
        if dtype not in rates:
            raise UsageError(f"calibration {self.path or ''} has no GEMM rate for dtype {dtype!r} "
                             f"(has: {', '.join(rates) or 'none'})")
        return _rate(rates[dtype].flops_per_s, f"calibration {self.path or ''}: GEMM rate of {dtype}")

    def copy_cost(self) -> tuple[float, float] | None:
        """(latency_s, bytes_per_s) of a local copy, bytes read and written; None before version 3 or
        where the sweep measured no copy."""
        c = self.result.copy
        return None if c is None else (float(c.latency_s), _rate(c.bytes_per_s, f"calibration {self.path or ''}: copy rate"))

    def memory_bytes(self) -> float | None:
        """Device memory in bytes (calibrations from a spec, version >= 10), or None when unknown."""
        return self.result.memory_bytes

    def spec(self) -> dict | None:
        """The hardware spec the calibration was written from (provenance origin), or None for a measured one."""
        return next((r["origin"]["spec"] for r in self.result.provenance["runs"] if "spec" in r.get("origin", {})),
                    None)

    def gemm_wave(self, dtype: str) -> tuple[int, int, int] | None:
        """(tiles per wave, tile rows, tile cols) of the device's GEMMs (calibrations from a spec that gives them,
        version >= 13), or None: no wave quantization priced."""
        self.gemm_flops_per_s(dtype)
        g = self.result.gemm[dtype]
        return None if g.wave_tiles is None else (int(g.wave_tiles), int(g.tile_rows), int(g.tile_cols))

    def gemm_latency_s(self, dtype: str) -> float:
        """Per-call overhead of a local product (0 in calibrations before version 3)."""
        self.gemm_flops_per_s(dtype)
        latency = self.result.gemm[dtype].latency_s
        return 0.0 if latency is None else float(latency)


def _rate(value: float, what: str) -> float:
    """A rate to divide by: UsageError where it is 0 (the schema allows it; no time can be priced from it)."""
    if not value > 0:
        raise UsageError(f"{what} is {value:g}: no time can be priced from it")
    return float(value)


def calibration_from_dict(data: dict, path: str | None = None) -> Calibration:
    """Validate a calibration dict and wrap it."""
    validate(data, path or "calibration")
    return Calibration(data, path)


def load_calibration(path) -> Calibration:
    """Read, validate and wrap a calibration file; any problem is one UsageError line."""
    p = input_path(path)
    return calibration_from_dict(read_json(p, "calibration"), str(p))
