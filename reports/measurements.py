"""The report's measurement section: an overview table and one latency/bandwidth figure per operation and link."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from microbench.ops import OPS, gemm_flops, itemsize
from microbench.sizes import format_size
from reports.curves import measured_figure
from reports.document import Note, Section, Table, Text
from reports.plotting import GB, US, save_figure
from reports.runs import RunSet


def overview(runs: RunSet) -> Table:
    """Per curve: size range, point count, smallest latency, best rate, and how many points missed the CI target."""
    rows = []
    for op, link in runs.op_links():
        for key, part in runs.curves(op, link):
            best = part["median_s"].min() * US
            if op == "gemm":
                n = np.sqrt(part["size_bytes"] / itemsize(key["dtype"]))
                rate = f"{(gemm_flops(n) / part['median_s']).max() / GB:.1f} GFLOP/s"
            else:
                rate = f"{(part['size_bytes'] * OPS[op].bus_factor(key['procs']) / part['median_s']).max() / GB:.3g} GB/s"
            missed = int((~part["target_met"].astype(bool)).sum()) if "target_met" in part else 0
            rows.append((op, link, str(key["procs"]), key["backend"], key["dtype"],
                         f"{format_size(part['size_bytes'].min())}–{format_size(part['size_bytes'].max())}",
                         str(len(part)), f"{best:.3g}", rate, str(missed)))
    return Table("Measured curves", ("operation", "link", "procs", "backend", "dtype", "sizes", "points",
                                     "min latency (µs)", "peak bus bandwidth / rate", "points off CI target"),
                 tuple(rows))


def section(runs: RunSet | None, cal, root: Path) -> Section:
    title = "Measurements"
    if runs is None:
        return Section("measurements", title, (Note("No sweep run given (--run DIR): no measured curves, "
                                                     "model overlays or residuals."),))
    blocks = [Text("Medians of the per-iteration time (maximum over ranks), with the 95% confidence interval "
                   "of each median as error bars; bus bandwidth uses the nccl-tests definition."),
              overview(runs)]
    blocks += [Note(why, "warning") for why in runs.notes]
    if cal is None:
        blocks.append(Note("No calibration given (--calibration CAL): curves are drawn without the fitted "
                           "model and without residuals."))
    for op, link in runs.op_links():
        fig = measured_figure(runs, op, link, cal)
        modelled = cal is not None and cal.has(op, link)
        rate = "compute rate" if op == "gemm" else "bus bandwidth"
        if modelled:
            caption = (f"Latency (left) and {rate} (middle) against size, with the fitted model (band: its 95% "
                       "prediction interval; dashed: extrapolated; shaded: the size range each model segment was "
                       "fitted on), and the model's relative error at each measured size (right).")
        else:
            caption = f"Latency (left) and {rate} (right) against size."
        if cal is not None and op == "gemm":
            caption += " Dotted: the calibration's GEMM rate."
        elif OPS[op].kind == "compute":
            caption += " A local operation: the calibration holds its rate in the compute section, not a model."
        elif cal is not None and not modelled:
            caption += " The calibration has no model for this operation and link."
        blocks.append(save_figure(fig, root, f"measured-{op}-{link}", f"{op} over {link} links", caption))
    return Section("measurements", title, tuple(blocks))
