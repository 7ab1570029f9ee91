"""The calibration as a result object (statsmodels-style): frozen values for every fitted parameter with its 95%
interval, built by the fit (and by calib.synthetic), written to JSON by `to_json`/`write` and read back by
`from_json` (calib.calibration.load_calibration validates first). Field names are the file's keys
(calib/calibration.schema.json, docs/calibration-format.md) in the file's order, so the one writer here reproduces
the file exactly. Provenance, fit options and link classes stay the plain JSON objects they are."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from copy import deepcopy
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from microbench.atomic import atomic_write_json

SCHEMA = "commcal.calibration"
VERSION = 20

Interval = tuple[float, float]
Models = Mapping[tuple[str, str], "Model"]


def _json(value):
    """A record, tuple, mapping or scalar as its JSON value (tuples become lists, records objects)."""
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, (tuple, list)):
        return [_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _json(v) for k, v in value.items()}
    return value


def _frozen(value):
    """A JSON list as a tuple (recursively); anything else as it is."""
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


OPTIONAL = {"optional": True}
"""Field metadata: the key is left out of the file where the value is None (added in a later version)."""


class Record:
    """A frozen dataclass whose fields are JSON keys in file order; nested records name their type in NESTED."""

    NESTED: dict = {}

    def to_json(self) -> dict:
        return {f.name: _json(getattr(self, f.name)) for f in fields(self)
                if not (f.metadata.get("optional") and getattr(self, f.name) is None)}

    @classmethod
    def from_json(cls, data: Mapping):
        def value(name):
            v = data.get(name)
            nested = cls.NESTED.get(name)
            if nested is None or v is None:
                return _frozen(v)
            return tuple(nested.from_json(x) for x in v) if isinstance(v, list) else nested.from_json(v)
        return cls(**{f.name: value(f.name) for f in fields(cls)})


@dataclass(frozen=True)
class Segment(Record):
    """One size range of a model: t = a(p) alpha + b(p) n beta, with standard errors, 95% intervals, the
    alpha-beta covariance and the relative residual scatter."""

    min_bytes: float
    max_bytes: float
    alpha_s: float
    alpha_se_s: float
    alpha_ci95_s: Interval
    beta_s_per_byte: float
    beta_se_s_per_byte: float
    beta_ci95_s_per_byte: Interval
    cov_alpha_beta_s2_per_byte: float
    rel_resid_sd: float
    r2: float
    n_points: int
    n_sizes: int


@dataclass(frozen=True)
class Candidate(Record):
    """An algorithm the fit tried, with its held-out error."""

    algorithm: str
    heldout_median_abs_rel_err: float | None
    heldout_p90_abs_rel_err: float | None
    n_segments: int


@dataclass(frozen=True)
class HeldOut(Record):
    """Cross-validated |relative error| over sizes held out of the fit (None: too few sizes)."""

    folds: int
    n_points: int
    median_abs_rel_err: float | None
    p90_abs_rel_err: float | None
    median_abs_rel_err_ge_4KiB: float | None
    p90_abs_rel_err_ge_4KiB: float | None


LAUNCH_WARN = 0.10
"""Above this launch spread (half the range of a point's per-launch medians, relative to the median) a point counts as
moving between MPI launches, and fit warns: the MPI library chose another mode (a protocol, a placement) in another
launch, so one launch's time is not the time every launch sees (docs/methodology.md, "Launches")."""


@dataclass(frozen=True)
class LaunchSpread(Record):
    """How far a model's points measured in more than one MPI launch (a sweep and its resumptions, or several runs
    fitted together) moved between launches: half the range of the launches' medians relative to the median."""

    launches: int
    n_points: int
    median: float
    max: float
    max_at_bytes: float
    max_at_procs: int


@dataclass(frozen=True)
class Speeds(Record):
    """(version 16; 17 and 18: as counted since) A model's points whose calls ran at several speeds, each held by a
    quarter of the calls or more (microbench.stats.point_speeds) or (18) a sustained fast minority
    (calib.points.sustained_minorities), and that are priced at the fastest: how many, of how many, and the largest
    ratio of such a point's slower calls' median to its price, and where; (19) that ratio at each size, so that a
    step is judged by the speeds its sweep saw near its size, not by an outlier of another size."""

    n_points: int
    of_points: int
    max_ratio: float
    max_at_bytes: float
    max_at_procs: int
    sizes: tuple[float, ...] | None = field(default=None, metadata=OPTIONAL)
    ratios: tuple[float, ...] | None = field(default=None, metadata=OPTIONAL)

    def ratio_at(self, lo_bytes: float, hi_bytes: float) -> float | None:
        """The largest slow-over-price ratio the sweep saw at the sizes it measured from the one at or below
        `lo_bytes` to the one at or above `hi_bytes` (version 19: `sizes`, every size of the model's points, and
        `ratios`, the largest at each, 1 where one speed; the loader holds `sizes` ascending); None where every such
        ratio is 1. Before 19: max_ratio, wherever it was seen."""
        if self.sizes is None or self.ratios is None:
            return self.max_ratio
        first = max(bisect_right(self.sizes, lo_bytes) - 1, 0)
        last = min(bisect_left(self.sizes, hi_bytes), len(self.sizes) - 1)
        worst = max(self.ratios[first:last + 1], default=1.0)
        return worst if worst > 1 else None


@dataclass(frozen=True)
class Source(Record):
    """Where a model or rate of a refined calibration came from (version 15): `kind` "spec" or "measured", and the
    provenance run ids behind it (the spec's run id, or the measured runs whose points it was fitted from)."""

    kind: str
    run_ids: tuple[str, ...]


@dataclass(frozen=True)
class Model(Record):
    """The chosen model of one (op, link): its algorithm, segments, the headline alpha (smallest sizes) and beta
    (largest) with their intervals, the candidates tried and the held-out error."""

    NESTED = {"segments": Segment, "candidates": Candidate, "heldout": HeldOut, "launch_spread": LaunchSpread,
              "source": Source, "speeds": Speeds}

    algorithm: str
    algorithm_description: str
    procs_measured: tuple[int, ...]
    identifiable: bool
    fit_method: str
    min_segment_sizes: int | None = field(metadata=OPTIONAL)
    alpha_s: float
    alpha_ci95_s: Interval
    beta_s_per_byte: float
    beta_ci95_s_per_byte: Interval
    segments: tuple[Segment, ...]
    candidates: tuple[Candidate, ...]
    heldout: HeldOut
    warnings: tuple[str, ...]
    launch_spread: LaunchSpread | None = field(default=None, metadata=OPTIONAL)
    source: Source | None = field(default=None, metadata=OPTIONAL)
    speeds: Speeds | None = field(default=None, metadata=OPTIONAL)

    @classmethod
    def build(cls, algorithm: str, description: str, procs, identifiable: bool, fit_method: str, segments,
              candidates, heldout: HeldOut, warnings, min_segment_sizes: int | None = None,
              launch_spread: LaunchSpread | None = None, speeds: Speeds | None = None) -> "Model":
        """A model whose headline alpha is its first segment's and beta its last's."""
        first, last = segments[0], segments[-1]
        return cls(algorithm, description, tuple(procs), identifiable, fit_method, min_segment_sizes, first.alpha_s,
                   tuple(first.alpha_ci95_s), last.beta_s_per_byte, tuple(last.beta_ci95_s_per_byte),
                   tuple(segments), tuple(candidates), heldout, tuple(warnings), launch_spread, speeds=speeds)

    @property
    def params(self) -> dict[str, float]:
        return {"alpha_s": self.alpha_s, "beta_s_per_byte": self.beta_s_per_byte}

    def conf_int(self) -> dict[str, Interval]:
        return {"alpha_s": self.alpha_ci95_s, "beta_s_per_byte": self.beta_ci95_s_per_byte}


@dataclass(frozen=True)
class HockneyRow(Record):
    """t = alpha + beta n at one process count over one size segment."""

    op: str
    link: str
    procs: int
    segment: int
    min_bytes: float
    max_bytes: float
    alpha_s: float
    alpha_se_s: float
    alpha_ci95_s: Interval
    beta_s_per_byte: float
    beta_se_s_per_byte: float
    beta_ci95_s_per_byte: Interval
    r2: float
    n_points: int


@dataclass(frozen=True)
class PointToPoint(Record):
    """A point-to-point operation's link parameters (the headline of its model)."""

    alpha_s: float
    alpha_ci95_s: Interval
    beta_s_per_byte: float
    beta_ci95_s_per_byte: Interval
    bandwidth_bytes_per_s: float | None

    @classmethod
    def of(cls, m: Model) -> "PointToPoint":
        return cls(m.alpha_s, m.alpha_ci95_s, m.beta_s_per_byte, m.beta_ci95_s_per_byte,
                   1.0 / m.beta_s_per_byte if m.beta_s_per_byte > 0 else None)


@dataclass(frozen=True)
class GemmRate(Record):
    """A dtype's saturated GEMM rate, its peak, where it saturates, the per-call latency (version >= 3), and the
    output tiles of rows x cols one wave of the device runs at once (version >= 13; absent: no wave quantization), and
    its source in a refined calibration (version >= 15)."""

    NESTED = {"source": Source}

    flops_per_s: float
    peak_flops_per_s: float
    saturation_bytes: float
    n_points: int
    latency_s: float | None = field(default=None, metadata=OPTIONAL)
    groups_per_node: int | None = field(default=None, metadata=OPTIONAL)
    wave_tiles: int | None = field(default=None, metadata=OPTIONAL)
    tile_rows: int | None = field(default=None, metadata=OPTIONAL)
    tile_cols: int | None = field(default=None, metadata=OPTIONAL)
    source: Source | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class CopyRate(Record):
    """A local copy: t = latency + bytes read and written / rate; its source in a refined calibration
    (version >= 15)."""

    NESTED = {"source": Source}

    bytes_per_s: float
    latency_s: float
    n_points: int
    groups_per_node: int
    source: Source | None = field(default=None, metadata=OPTIONAL)


def _grouped(models: Models) -> dict[tuple[str, str], Model]:
    """Models in the file's nesting order: by op as first seen, then link."""
    ops = dict.fromkeys(op for op, _ in models)
    return {(op, link): m for op in ops for (o, link), m in models.items() if o == op}


def _models_from_json(nested: Mapping) -> dict[tuple[str, str], Model]:
    return {(op, link): Model.from_json(m) for op, by_link in nested.items() for link, m in by_link.items()}


def _models_to_json(models: Models) -> dict:
    out: dict = {}
    for (op, link), m in models.items():
        out.setdefault(op, {})[link] = m.to_json()
    return out


@dataclass(frozen=True)
class AfterCompute:
    """Models of collectives measured right after a local computation (sweeps with --after-gemm)."""

    after_gemm: int
    run_ids: tuple[str, ...]
    models: Models

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", _grouped(self.models))

    def to_json(self) -> dict:
        return {"after_gemm": self.after_gemm, "run_ids": list(self.run_ids), "models": _models_to_json(self.models)}

    @classmethod
    def from_json(cls, data: Mapping) -> "AfterCompute":
        return cls(data["after_gemm"], tuple(data["run_ids"]), _models_from_json(data["models"]))


def p2p_of(models: Models, p2p_ops) -> dict[str, dict[str, PointToPoint]]:
    """The p2p section: the headline of every point-to-point model, by op and link."""
    out: dict = {}
    for (op, link), m in models.items():
        if op in p2p_ops:
            out.setdefault(op, {})[link] = PointToPoint.of(m)
    return out


@dataclass(frozen=True, eq=False)
class CalibrationResult:
    """A whole calibration: models by (op, link) in file order (by op, then link), the after-compute models, Hockney rows, point-to-point
    parameters, GEMM and copy rates, device memory (None: unknown), warnings; `fit`, `provenance`, `link_classes` and `topology` are the file's objects."""

    created_utc: str
    backend: str
    fit: dict
    provenance: dict
    link_classes: dict
    models: Models
    hockney: tuple[HockneyRow, ...]
    p2p: Mapping[str, Mapping[str, PointToPoint]]
    gemm: Mapping[str, GemmRate]
    warnings: tuple[str, ...]
    after_compute: AfterCompute | None = None
    copy: CopyRate | None = None
    memory_bytes: float | None = None
    version: int = VERSION
    topology: dict | None = None    # the switch levels the sweeps measured on (version >= 14); None: flat

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", _grouped(self.models))

    # ---- the one writer and the one reader
    def to_json(self) -> dict:
        after = {} if self.after_compute is None else {"after_compute": self.after_compute.to_json()}
        copy_rate = {} if self.copy is None else {"copy": self.copy.to_json()}
        memory = {} if self.memory_bytes is None else {"memory_bytes": self.memory_bytes}
        topology = {} if self.topology is None else {"topology": deepcopy(self.topology)}
        return {
            "schema": SCHEMA, "version": self.version, "created_utc": self.created_utc, "backend": self.backend,
            "fit": deepcopy(self.fit), "provenance": deepcopy(self.provenance),
            **topology, "link_classes": deepcopy(self.link_classes), "models": _models_to_json(self.models), **after,
            "hockney": [h.to_json() for h in self.hockney],
            "p2p": {op: {link: q.to_json() for link, q in by.items()} for op, by in self.p2p.items()},
            "compute": {"gemm": {dt: g.to_json() for dt, g in self.gemm.items()}, **memory, **copy_rate},
            "warnings": list(self.warnings),
        }

    def write(self, path) -> None:
        """Write the file atomically (validate it first: calib.calibration.validate)."""
        atomic_write_json(path, self.to_json())

    @classmethod
    def from_json(cls, data: Mapping) -> "CalibrationResult":
        """The result of a calibration dict that calib.calibration.validate accepted (any version it reads)."""
        after = data.get("after_compute")
        copy_rate = data["compute"].get("copy")
        return cls(data["created_utc"], data["backend"], deepcopy(data["fit"]),
                   deepcopy(data["provenance"]), deepcopy(data["link_classes"]),
                   _models_from_json(data["models"]), tuple(HockneyRow.from_json(h) for h in data["hockney"]),
                   {op: {link: PointToPoint.from_json(q) for link, q in by.items()} for op, by in data["p2p"].items()},
                   {dt: GemmRate.from_json(g) for dt, g in data["compute"]["gemm"].items()}, tuple(data["warnings"]),
                   None if after is None else AfterCompute.from_json(after),
                   None if copy_rate is None else CopyRate.from_json(copy_rate), data["compute"].get("memory_bytes"),
                   data["version"], deepcopy(data.get("topology")))

    @classmethod
    def of(cls, cal) -> "CalibrationResult":
        """A result from a result, a loaded calib.calibration.Calibration or a (validated) calibration dict."""
        if isinstance(cal, cls):
            return cal
        result = getattr(cal, "result", None)
        return result if isinstance(result, cls) else cls.from_json(cal)

    # ---- reading it
    @property
    def after_gemm(self) -> int:
        """N of the GEMM before each call of the sweeps behind the after-compute models (0: none)."""
        return 0 if self.after_compute is None else int(self.after_compute.after_gemm)

    def model_sets(self) -> list[tuple[str, Models]]:
        """(suffix, models): the main models (suffix "") and, where the file has them, the after-compute ones
        (" after compute", as reports and diff label them)."""
        after = [] if self.after_compute is None else [(" after compute", self.after_compute.models)]
        return [("", self.models), *after]

    def machines(self) -> set[str]:
        return {r["machine"] for r in self.provenance["runs"]}

    def summary(self) -> str:
        """Held-out figures per (op, link), then point-to-point and GEMM figures (what `commcal fit` prints)."""
        lines = [f"{'op':<15}{'link':<8}{'model':<20}{'seg':>4}{'med':>8}{'p90':>8}{'med>=4K':>9}{'p90>=4K':>9}"]
        for suffix, models in self.model_sets():
            if suffix:
                lines.append(f"after compute ({self.after_gemm}x{self.after_gemm} GEMM before each call):")
            for (op, link), m in sorted(models.items()):
                h = m.heldout
                lines.append(f"{op:<15}{link:<8}{m.algorithm:<20}{len(m.segments):>4}  "
                             f"{_pct(h.median_abs_rel_err)}  {_pct(h.p90_abs_rel_err)}   "
                             f"{_pct(h.median_abs_rel_err_ge_4KiB)}   {_pct(h.p90_abs_rel_err_ge_4KiB)}")
        for op, by_link in sorted(self.p2p.items()):
            for link, q in sorted(by_link.items()):
                bw = q.bandwidth_bytes_per_s
                lines.append(f"p2p {op} {link}: alpha {q.alpha_s * 1e6:.3g} us, beta {q.beta_s_per_byte:.4g} s/B"
                             + (f" ({bw / 1e6:.4g} MB/s)" if bw else ""))
        for dtype, g in sorted(self.gemm.items()):
            lines.append(f"gemm {dtype}: {g.flops_per_s / 1e9:.4g} GFLOP/s, saturating from {g.saturation_bytes:g} B")
        return "\n".join(lines)


def _pct(x) -> str:
    return "   -  " if x is None else f"{x:6.1%}"
