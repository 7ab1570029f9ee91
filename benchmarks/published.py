"""Published Megatron-LM runs on Selene against the training-step model priced from one spec (calib/selene.spec.json):
per row the configuration, measured and predicted seconds per iteration and the error; then the mean absolute
percentage error, the largest error, and rank agreement (the order of the two settings of each model, and
Kendall tau of achieved TFLOP/s per GPU over the rows). One spec, one model, no per-row tuning.
Run: python -m benchmarks.published [--dir DIR] [--spec SPEC]  (DIR: the published CSVs, default ../shared/published)."""

from __future__ import annotations

import argparse
import csv
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analysis.ranking import layer_metrics
from analysis.schedules import Schedule
from analysis.training import Config, TrainingPricer, Transformer
from calib.calibration import calibration_from_dict
from calib.spec import load_spec

REPO = Path(__file__).resolve().parent.parent
VOCAB, SEQ = 51200, 2048
KORTHIKANTI = {"full": ("full", False), "selective_sp": ("selective", True)}
"""Table 5's two settings: (recomputation, sequence parallelism)."""


@dataclass(frozen=True)
class Row:
    """One published run: where it comes from, the model, the configuration and the measured seconds."""

    table: str
    label: str
    model: Transformer
    config: Config
    gpus: int
    measured_s: float


def _read(path: Path) -> list[dict]:
    with path.open() as fh:
        return list(csv.DictReader(line for line in fh if not line.startswith("#")))


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


def narayanan(path: Path, cal) -> list[Row]:
    """Table 1: full recomputation, tensor parallelism with all-reduce, no ZeRO, gradients reduced after the backward
    pass; measured seconds = the paper's FLOPs / (TFLOP/s per GPU x GPUs). The interleaving v is not published: the
    model's own fastest v (1F1B or interleaved) stands for the one the authors tuned."""
    rows = []
    for r in _read(path):
        model = _model(r, int(r["global_batch"]))
        t, p, d, gpus = int(r["t"]), int(r["p"]), int(r["d"]), int(r["gpus"])
        mb = int(r["microbatch"])
        pricer = TrainingPricer(cal, model, gpus, 8, "float16")
        scheds = [Schedule("1f1b")] + [Schedule("interleaved", v) for v in range(2, 9)
                                       if p > 1 and (model.layers // p) % v == 0]
        configs = [Config(t, p, d, mb, s, 0, False, "full", False) for s in scheds]
        best = min((pricer.price(c) for c in configs), key=lambda s: s.total_s)
        measured = model.flops("full") / (float(r["tflops_per_gpu"]) * 1e12 * gpus)
        rows.append(Row(path.name, f"{r['params_b']}B", model, best.config, gpus, measured))
    return rows


def report(rows: list[Row], cal) -> dict:
    """Print the table of one CSV and return its figures."""
    print(f"\n{rows[0].table}")
    print(f"{'row':<18}{'configuration':<52}{'measured':>10}{'predicted':>11}{'error':>9}  breakdown (s)")
    preds, errs = [], []
    for row in rows:
        step = TrainingPricer(cal, row.model, row.gpus, 8, "float16").price(row.config)
        err = step.total_s / row.measured_s - 1
        preds.append(step.total_s)
        errs.append(err)
        parts = " ".join(f"{k[:-2]} {getattr(step, k):.2f}" for k in step.PARTS if getattr(step, k) > 0.005)
        print(f"{row.label:<18}{str(row.config):<52}{row.measured_s:>10.2f}{step.total_s:>11.2f}{100 * err:>+8.1f}%  "
              f"{parts}")
    errs = np.abs(np.array(errs))
    meas = np.array([r.measured_s for r in rows])
    flops = np.array([r.model.flops("full") / r.gpus for r in rows])
    tau = layer_metrics(np.array(preds) / flops, meas / flops)["kendall_tau"]
    print(f"MAPE {100 * errs.mean():.2f}%, max {100 * errs.max():.2f}% over {len(rows)} rows; Kendall tau of "
          f"TFLOP/s per GPU over the rows {tau:.3f}")
    pairs = {}
    for row, pred in zip(rows, preds):
        pairs.setdefault(row.label.split()[0], []).append((pred, row.measured_s))
    shared = [v for v in pairs.values() if len(v) > 1]
    if shared:
        right = sum(layer_metrics([p for p, _ in v], [m for _, m in v])["pairwise_accuracy"] for v in shared)
        print(f"order of the settings within each model: {right:g} of {len(shared)} models right")
    return {"mape": errs.mean(), "max": errs.max(), "tau": tau}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.published", description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=str(REPO.parent / "shared" / "published"), help="the published CSVs")
    ap.add_argument("--spec", default="selene", help="hardware spec (a file, or a shipped name)")
    args = ap.parse_args(argv)
    cal = calibration_from_dict(load_spec(args.spec).to_json())
    t0 = time.perf_counter()
    folder = Path(args.dir)
    report(korthikanti(folder / "korthikanti2022-table5.csv"), cal)
    report(narayanan(folder / "narayanan2021-table1.csv", cal), cal)
    print(f"\n{time.perf_counter() - t0:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
