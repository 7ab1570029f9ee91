"""Benchmarks that print figures: the training-step search over the whole space (targets: GPT-3 175B on 1,024
devices <= 1 s, a 1T model on 4,096 devices <= 10 s) on the Selene spec; then strategy cost evaluations per
second, search seconds for a 96-layer transformer on a 1,024-device three-level mesh, and coordinate descent's gap
to the exact optimum.
Run: python -m benchmarks.search [CALIBRATION]  (default: a synthetic calibration)."""

from __future__ import annotations

import sys
import time

import numpy as np

from analysis.mesh import parse_mesh
from analysis.models import parse_model
from analysis.pricing import Pricer
from analysis.search import Tabulator, chain_cost, coordinate_descent, dp, evaluate_many
from analysis.training import TrainingPricer, Transformer, space


def _calibration(argv):
    from calib.calibration import calibration_from_dict, load_calibration
    from calib.synthetic import synthetic_calibration

    if argv:
        return load_calibration(argv[0])
    models = {(op, link): (a, 1 / bw) for op in ("allreduce", "allgather", "reduce_scatter", "alltoall")
              for link, a, bw in (("intra", 5e-6, 150e9), ("inter", 20e-6, 12e9), ("spread", 25e-6, 10e9))}
    return calibration_from_dict(synthetic_calibration(models, gemm={"float32": 60e12}))


def main(argv=None) -> int:
    training_search()     # first: `commcal search --model` runs in a process of its own
    cal = _calibration(sys.argv[1:] if argv is None else argv)
    mesh = parse_mesh("8x16x8")
    model = parse_model("autoddl-transformer:layers=96")
    t0 = time.perf_counter()
    tables = Tabulator(Pricer(cal, mesh)).tables(model)
    t1 = time.perf_counter()
    choice, best = dp(tables)
    t2 = time.perf_counter()
    print(f"96-layer transformer ({len(model.layers)} layers) on {mesh}: tables {t1 - t0:.2f} s + "
          f"exact DP {t2 - t1:.3f} s = {t2 - t0:.2f} s; optimum {best:.4g} s")
    for window in (1, 2):
        t3 = time.perf_counter()
        cd = coordinate_descent(tables, restarts=8, window=window)
        print(f"coordinate descent (window {window}, 8 restarts): {time.perf_counter() - t3:.2f} s, "
              f"{100 * (chain_cost(tables, cd) / best - 1):.3f}% above the optimum")
    rng = np.random.default_rng(0)
    sizes = np.array([len(o.strategies) for o in tables.options])
    choices = (rng.random((4000, len(sizes))) * sizes).astype(np.int64)
    t4 = time.perf_counter()
    evaluate_many(tables, choices)
    dt = time.perf_counter() - t4
    evals = choices.size
    print(f"whole-model evaluations: {choices.shape[0]} assignments x {len(sizes)} layer strategies in {dt:.3f} s "
          f"= {evals / dt:,.0f} strategy cost evaluations/s")
    pricer = Pricer(cal, mesh)
    fresh = Tabulator(pricer).options(model.layers[3], True)
    steps = [sc.steps for sc in fresh.schedules] * 200
    t5 = time.perf_counter()
    pricer.price(steps)
    dt = time.perf_counter() - t5
    print(f"layer schedules priced from the calibration: {len(steps)} in {dt:.3f} s = {len(steps) / dt:,.0f}/s")
    return 0


def training_search() -> None:
    """Seconds to price every training configuration of two models on the Selene spec (8 devices per node), timed
    before the benchmark's other parts: the objects they leave alive make Python's garbage collector scan longer
    (0.4 s more for GPT-3 when timed after them), which a search in its own process does not pay."""
    from calib.calibration import calibration_from_dict
    from calib.spec import load_spec

    cal = calibration_from_dict(load_spec("selene").to_json())
    for name, devices, target in (("gpt3-175b", 1024, 1.0), ("gpt-1t", 4096, 10.0)):
        t0 = time.perf_counter()
        pricer = TrainingPricer(cal, Transformer.parse(name), devices, 8, "float16", memory_bytes=cal.memory_bytes())
        steps = [pricer.price(c) for c in space(pricer.model, devices)]
        dt = time.perf_counter() - t0
        best = min((s for s in steps if s.feasible), key=lambda s: s.total_s)
        print(f"training search {name} on {devices} devices: {len(steps):,} configurations in {dt:.2f} s "
              f"(target <= {target:g} s), {1e6 * dt / len(steps):.1f} us each; best {best.config}: {best.total_s:.3g} s")


if __name__ == "__main__":
    sys.exit(main())
