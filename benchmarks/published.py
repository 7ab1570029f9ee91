"""Published Megatron-LM runs on Selene against the training-step model priced from one spec (calib/selene.spec.json):
per row the configuration, measured and predicted seconds per iteration and the error; then the mean absolute
percentage error, the largest error, and rank agreement (the order of the two settings of each model, and
Kendall tau of achieved TFLOP/s per GPU over the rows). One spec, one model, no per-row tuning. --ablation: the
errors with each modelling choice of analysis.training.Terms switched off, and with a few spec variants.
Run: python -m benchmarks.published [--dir DIR] [--spec SPEC] [--ablation]  (DIR: the published CSVs, default
../shared/published)."""

from __future__ import annotations

import csv
import sys
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

from analysis.ranking import layer_metrics
from analysis.schedules import Schedule
from analysis.training import Config, Step, Terms, TrainingPricer, Transformer
from calib.calibration import calibration_from_dict
from calib.spec import from_spec, read_spec
from microbench.errors import UsageError
from benchmarks import benchmark_parser

REPO = Path(__file__).resolve().parent.parent
VOCAB, SEQ = 51200, 2048
TABLES = ("korthikanti2022-table5.csv", "narayanan2021-table1.csv")
KORTHIKANTI = {"full": ("full", False), "selective_sp": ("selective", True)}
"""Table 5's two settings: (recomputation, sequence parallelism)."""
SPEC_VARIANTS = {
    "flat GEMM curve (no per-call latency)": lambda s: _device(s, gemm_half_gflop=1e-6),
    "GEMM at peak (max efficiency 1.0)": lambda s: _device(s, gemm_max_efficiency=1.0),
    "HBM efficiency 1.0": lambda s: _device(s, memory_efficiency=1.0),
    "link efficiencies 1.0": lambda s: {**s, "tiers": [{**t, "efficiency": 1.0} for t in s["tiers"]]},
}
"""Spec changes the ablation shows beside the model's own terms (what each public figure does to the error)."""


def _device(spec: dict, **changes) -> dict:
    return {**spec, "device": {**spec["device"], **changes}}


@dataclass(frozen=True)
class Row:
    """One published run: where it comes from, the model, the configuration and the measured seconds."""

    table: str
    label: str
    model: Transformer
    config: Config
    gpus: int
    measured_s: float


@dataclass(frozen=True)
class Figures:
    """One table's agreement: per-row relative errors, their mean and largest magnitude, Kendall tau of TFLOP/s
    per GPU over the rows, and the models whose settings' order is right (of those with several rows)."""

    errors: tuple[float, ...]
    mape: float
    max: float
    tau: float
    order_right: float
    order_models: int


def _read(path: Path) -> list[dict]:
    try:
        with path.open() as fh:
            return list(csv.DictReader(line for line in fh if not line.startswith("#")))
    except OSError as exc:
        raise UsageError(f"{path}: cannot read published table ({exc.strerror or exc})") from None


def _model(r: dict, batch: int) -> Transformer:
    return Transformer.parse(f"transformer:d={r['hidden']},heads={r['heads']},layers={r['layers']},seq={SEQ},"
                             f"batch={batch},vocab={VOCAB}")


def korthikanti(path: Path) -> list[Row]:
    """Table 5: d = 1; the interleave column is v; full recomputation with all-reduce, or selective with SP."""
    rows = []
    for r in _read(path):
        t, p, v = int(r["t"]), int(r["p"]), int(r["interleave"])
        sched = Schedule("interleaved", v) if v > 1 else Schedule("1f1b")
        for setting, (rc, sp) in KORTHIKANTI.items():
            cfg = Config(t, p, int(r["gpus"]) // (t * p), int(r["microbatch"]), sched, 0, sp, rc, False)
            rows.append(Row(path.name, f"{r['model']} {setting}", _model(r, int(r["global_batch"])), cfg,
                            int(r["gpus"]), float(r[f"{setting}_iteration_s"])))
    return rows


def narayanan(path: Path, cal, terms: Terms = Terms()) -> list[Row]:
    """Table 1: full recomputation, tensor parallelism with all-reduce, no ZeRO, gradients reduced after the backward
    pass; measured seconds = the paper's FLOPs / (TFLOP/s per GPU x GPUs). The interleaving v is not published: the
    model's own fastest v (1F1B or interleaved) stands for the one the authors tuned."""
    rows = []
    for r in _read(path):
        model = _model(r, int(r["global_batch"]))
        t, p, d, gpus = int(r["t"]), int(r["p"]), int(r["d"]), int(r["gpus"])
        mb = int(r["microbatch"])
        pricer = TrainingPricer(cal, model, gpus, 8, "float16", terms=terms)
        scheds = [Schedule("1f1b")] + [Schedule("interleaved", v) for v in range(2, 9)
                                       if p > 1 and (model.layers // p) % v == 0]
        configs = [Config(t, p, d, mb, s, 0, False, "full", False) for s in scheds]
        best = min((pricer.price(c) for c in configs), key=lambda s: s.total_s)
        measured = model.flops("full") / (float(r["tflops_per_gpu"]) * 1e12 * gpus)
        rows.append(Row(path.name, f"{r['params_b']}B", model, best.config, gpus, measured))
    return rows


def tables(folder: Path, cal, terms: Terms = Terms()) -> list[list[Row]]:
    """The rows of both published tables in `folder`."""
    return [korthikanti(folder / TABLES[0]), narayanan(folder / TABLES[1], cal, terms)]


def predict(rows: list[Row], cal, terms: Terms = Terms()) -> list[Step]:
    return [TrainingPricer(cal, r.model, r.gpus, 8, "float16", terms=terms).price(r.config) for r in rows]


def figures(rows: list[Row], steps: list[Step]) -> Figures:
    """Errors and rank agreement of predicted against measured seconds."""
    pred = np.array([s.total_s for s in steps])
    meas = np.array([r.measured_s for r in rows])
    errs = pred / meas - 1
    flops = np.array([r.model.flops("full") / r.gpus for r in rows])
    tau = layer_metrics(pred / flops, meas / flops)["kendall_tau"]
    pairs: dict[str, list[tuple[float, float]]] = {}
    for row, p in zip(rows, pred):
        pairs.setdefault(row.label.split()[0], []).append((p, row.measured_s))
    shared = [v for v in pairs.values() if len(v) > 1]
    right = sum(layer_metrics([p for p, _ in v], [m for _, m in v])["pairwise_accuracy"] for v in shared)
    return Figures(tuple(errs), float(np.abs(errs).mean()), float(np.abs(errs).max()), tau, right, len(shared))


def report(rows: list[Row], steps: list[Step]) -> Figures:
    """Print the table of one CSV and return its figures."""
    print(f"\n{rows[0].table}")
    print(f"{'row':<18}{'configuration':<52}{'measured':>10}{'predicted':>11}{'error':>9}  breakdown (s)")
    fig = figures(rows, steps)
    for row, step, err in zip(rows, steps, fig.errors):
        parts = " ".join(f"{k[:-2]} {getattr(step, k):.2f}" for k in step.PARTS if getattr(step, k) > 0.005)
        print(f"{row.label:<18}{str(row.config):<52}{row.measured_s:>10.2f}{step.total_s:>11.2f}{100 * err:>+8.1f}%  "
              f"{parts}")
    print(f"MAPE {100 * fig.mape:.2f}%, max {100 * fig.max:.2f}% over {len(rows)} rows; Kendall tau of "
          f"TFLOP/s per GPU over the rows {fig.tau:.3f}")
    if fig.order_models:
        print(f"order of the settings within each model: {fig.order_right:g} of {fig.order_models} models right")
    return fig


def ablation(folder: Path, spec: dict, name: str) -> None:
    """MAPE / max of both tables with the model as it is, each Terms choice off, all off, and each spec variant."""
    variants = [("the model (all terms on)", spec, Terms())]
    variants += [(f"{f.name} off", spec, Terms(**{f.name: False})) for f in fields(Terms)]
    variants += [("all terms off", spec, Terms(**{f.name: False for f in fields(Terms)}))]
    variants += [(f"spec: {label}", change(spec), Terms()) for label, change in SPEC_VARIANTS.items()]
    print(f"\nablation (MAPE / max): {' | '.join(TABLES)}")
    for label, s, terms in variants:
        cal = calibration_from_dict(from_spec(s, name).to_json())
        figs = [figures(rows, predict(rows, cal, terms)) for rows in tables(folder, cal, terms)]
        print(f"{label:<46}" + " | ".join(f"{100 * f.mape:6.2f}% / {100 * f.max:6.2f}%" for f in figs))


def main(argv=None) -> int:
    ap = benchmark_parser("benchmarks.published", __doc__)
    ap.add_argument("--dir", default=str(REPO.parent / "shared" / "published"), help="the published CSVs")
    ap.add_argument("--spec", default="selene", help="hardware spec (a file, or a shipped name)")
    ap.add_argument("--ablation", action="store_true", help="also the errors with each modelling choice off")
    args = ap.parse_args(argv)
    try:
        spec = read_spec(args.spec)
        cal = calibration_from_dict(from_spec(spec, args.spec).to_json())
        t0 = time.perf_counter()
        folder = Path(args.dir)
        for rows in tables(folder, cal):
            report(rows, predict(rows, cal))
        if args.ablation:
            ablation(folder, spec, args.spec)
    except UsageError as exc:
        print(f"python -m benchmarks.published: {exc}", file=sys.stderr)
        return 2
    print(f"\n{time.perf_counter() - t0:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
