"""A calibration as a planner's or simulator's own machine description: Calculon's system JSON (network tiers and the
matrix rate), ASTRA-sim's analytical network YAML (one dimension per link class) and SimAI's busbw.yaml (bus bandwidth
per parallel group and collective). Pure. What a format needs and the calibration cannot supply is named in
Export.missing, never invented; docs/import-export.md says what each mapping loses."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from calib.algorithms import algorithm
from calib.calibration import Calibration
from microbench.errors import UsageError
from microbench.ops import OPS

TIER_LINKS = ("intra", "inter", "spread")
"""Link classes as network levels, innermost first; a calibration with both inter and spread exports inter (one
rank per node: the link's own rate, not shared by a node's ranks)."""
CALCULON_OPS = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reduce_scatter"}
ASTRA_TOPOLOGIES = ("Ring", "FullyConnected", "Switch")
SIMAI_GROUPS = {"TP": ("intra", ("allreduce", "allgather", "reduce_scatter", "alltoall")),
                "DP": ("outer", ("allreduce", "allgather", "reduce_scatter", "alltoall")),
                "EP": ("outer", ("allreduce", "allgather", "reduce_scatter", "alltoall"))}
"""SimAI's groups and the link class each is priced on: tensor parallelism inside a node, data and expert
parallelism across nodes ('outer': inter, else spread); pipeline parallelism (PP) is the outer link's pingpong."""
SIMAI_NAMES = {"allreduce": "allreduce", "allgather": "allgather", "reduce_scatter": "reducescatter",
               "alltoall": "alltoall"}


@dataclass(frozen=True)
class Export:
    """One exported file's text and the fields its format needs that the calibration could not supply."""

    text: str
    missing: tuple[str, ...]


@dataclass(frozen=True)
class Level:
    """One link class as a network level: its point-to-point latency and rate, and the most ranks measured on it."""

    link: str
    alpha_s: float
    bytes_per_s: float
    procs: int


def levels(cal: Calibration) -> tuple[list[Level], list[str]]:
    """The exportable link classes, innermost first, and a line for each one left out: a level needs its
    point-to-point (pingpong) model, whose alpha and beta are the link's latency and rate."""
    classes = cal.link_classes()
    links = [lk for lk in TIER_LINKS if lk in classes and not (lk == "spread" and "inter" in classes)]
    out, missing = [], []
    for link in links:
        p2p = cal.result.p2p.get("pingpong", {}).get(link)
        if p2p is None or not p2p.beta_s_per_byte > 0:
            missing.append(f"{link}: no pingpong model (sweep --ops pingpong on that link), so no latency or rate")
            continue
        out.append(Level(link, max(p2p.alpha_s, 0.0), 1.0 / p2p.beta_s_per_byte, max(classes[link]["procs"])))
    if not out:
        raise UsageError("the calibration has no link class with a pingpong model: an export needs each link's "
                         "point-to-point latency and rate (sweep --ops pingpong)")
    return out, missing


def _ring_factor(name: str) -> float | None:
    """k when the algorithm's bandwidth coefficient b(p) is k (p-1)/p, the shape Calculon's (scalar, offset -1)
    expresses; None otherwise (log2 p shapes)."""
    p = np.arange(2.0, 65.0)
    k = algorithm(name).b(p) * p / (p - 1)
    return float(k[0]) if np.allclose(k, k[0]) else None


def calculon(cal: Calibration) -> Export:
    """Calculon's system JSON: a network tier per level (bandwidth in GB/s at efficiency 1, the measured rate;
    latency in s; op scalars and offsets from the fitted algorithms) and the matrix rate of the largest GEMM dtype."""
    tiers, missing = levels(cal)
    networks = []
    for lv in tiers:
        ops: dict[str, list] = {"p2p": [1.0, None]}
        for name, op in CALCULON_OPS.items():
            model = cal.result.models.get((op, lv.link))
            if model is None:
                missing.append(f"networks[{lv.link}].ops.{name}: no {op} model on {lv.link}")
                continue
            k = _ring_factor(model.algorithm)
            ratio = model.beta_s_per_byte * lv.bytes_per_s
            if k is None:   # log2 p bandwidth shapes: fixed at the level's size
                ops[name] = [float(algorithm(model.algorithm).b(lv.procs)) * ratio, 0]
            else:
                ops[name] = [k * ratio, -1]
        networks.append({"bandwidth": lv.bytes_per_s / 1e9, "efficiency": 1.0, "size": lv.procs,
                         "latency": lv.alpha_s, "ops": ops})
        missing += [f"networks[{lv.link}].must_be_filled", f"networks[{lv.link}].processor_usage"]
    doc: dict = {"networks": networks}
    gemm = cal.result.gemm
    if gemm:
        dtype = max(gemm, key=lambda d: gemm[d].flops_per_s)
        doc = {"matrix": {"tflops": gemm[dtype].flops_per_s / 1e12,
                          "gflops_efficiency": {dtype: [[0, 1.0]]}}, **doc}
    else:
        missing.append("matrix: the calibration has no GEMM rate")
    missing += ["vector", "mem1", "mem2", "processing_mode"]
    return Export(json.dumps(doc, indent=2) + "\n", tuple(missing))


def _yaml_list(values) -> str:
    return "[ " + ", ".join(str(v) for v in values) + " ]"


def astra_sim(cal: Calibration, topology: list[str] | None) -> Export:
    """ASTRA-sim's analytical network YAML: one dimension per level (npus_count: the ranks of that level per unit
    of the next; bandwidth GB/s; latency ns). The topology of each dimension is not measured: it must be given."""
    tiers, missing = levels(cal)
    if not topology or len(topology) != len(tiers):
        raise UsageError(f"astra-sim needs --topology with one of {', '.join(ASTRA_TOPOLOGIES)} for each of the "
                         f"{len(tiers)} dimension(s) ({', '.join(lv.link for lv in tiers)}): a calibration does not "
                         f"measure the topology")
    bad = [t for t in topology if t not in ASTRA_TOPOLOGIES]
    if bad:
        raise UsageError(f"--topology {bad[0]!r} is not one of {', '.join(ASTRA_TOPOLOGIES)}")
    counts, inner = [], 1
    for lv in tiers:
        counts.append(max(lv.procs // inner, 1))
        inner *= counts[-1]
    text = (f"topology: {_yaml_list(topology)}\n"
            f"npus_count: {_yaml_list(counts)}\n"
            f"bandwidth: {_yaml_list(round(lv.bytes_per_s / 1e9, 6) for lv in tiers)}  # GB/s\n"
            f"latency: {_yaml_list(round(lv.alpha_s * 1e9, 3) for lv in tiers)}  # ns\n")
    return Export(text, tuple(missing))


def busbw(cal: Calibration, op: str, link: str) -> float | None:
    """An operation's bus bandwidth (bytes/s) on a link at the largest size and process count its model measured
    (nccl-tests' definition: size * bus factor / time); None without a model."""
    model = cal.result.models.get((op, link))
    if model is None:
        return None
    procs, nbytes = max(model.procs_measured), model.segments[-1].max_bytes
    seconds = float(cal.predict_seconds(op, link, procs, np.array([nbytes]))[0])
    return nbytes * OPS[op].bus_factor(procs) / seconds if seconds > 0 else None


def simai(cal: Calibration) -> Export:
    """SimAI's busbw.yaml: busbw in GB/s per group (TP on intra, DP and EP on the outer link) and collective, null
    where the calibration has no model; PP is the outer link's pingpong rate."""
    classes = cal.link_classes()
    outer = "inter" if "inter" in classes else "spread" if "spread" in classes else None
    lines, missing = ["commcal"], []
    for group, (where, ops) in SIMAI_GROUPS.items():
        link = "intra" if where == "intra" else outer
        lines.append(f"{group}:")
        for op in ops:
            bw = busbw(cal, op, link) if link else None
            if bw is None:
                missing.append(f"{group}.{SIMAI_NAMES[op]}: no {op} model on {link or 'an inter-node link'}")
            lines.append(f"{SIMAI_NAMES[op]},: {'null' if bw is None else round(bw / 1e9, 6)}")
    q = cal.result.p2p.get("pingpong", {}).get(outer) if outer else None
    pp = None if q is None else q.bandwidth_bytes_per_s
    if not pp:
        missing.append("PP.busbw: no pingpong model on an inter-node link")
    lines += ["PP:", f"busbw: {round(pp / 1e9, 6) if pp else 'null'}"]
    return Export("\n".join(lines) + "\n", tuple(missing))
