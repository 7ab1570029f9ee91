"""A calibration as a planner's or simulator's own machine description: Calculon's system JSON (network tiers and the
matrix rates), ASTRA-sim's analytical network YAML (one dimension per link class) and SimAI's busbw.yaml (bus bandwidth
per parallel group and collective). Pure. Each format is written in the units and meanings its own reader applies
(docs/import-export.md names the reader's code); what a format needs and the calibration cannot supply is named in
Export.missing, never invented."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from calib.algorithms import algorithm
from calib.calibration import Calibration
from calib.result import GemmRate
from microbench.errors import UsageError
from microbench.ops import OPS

TIER_LINKS = ("intra", "inter", "spread")
"""Link classes as network levels, innermost first; a calibration with both inter and spread exports inter (one
rank per node: the link's own rate, not shared by a node's ranks)."""
OUTER_LINKS = ("inter", "spread")
CALCULON_OPS = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reduce_scatter"}
CALCULON_DTYPES = ("float8", "float16", "bfloat16", "float32")
"""The matrix datatypes Calculon's system reader knows; a GEMM rate of another dtype has no place in its file."""
CALCULON_KEYS = ("must_be_filled", "processor_usage")
"""A Calculon network tier's fields that are not measured: taken from a --template system file, else named."""
ASTRA_TOPOLOGIES = ("Ring", "FullyConnected", "Switch")
ASTRA_HOPS = {"Ring": 1, "FullyConnected": 1, "Switch": 2}
"""Hops ASTRA-sim's analytical backend charges a message between two neighbouring NPUs of a dimension (a Switch:
source to switch to destination), each hop one `latency`."""
GIB = float(1 << 30)
"""ASTRA-sim's and SimAI's "GB": both readers turn their GB/s figures into bytes with 2^30."""
SIMAI_GROUPS = {"TP": ("intra", ("allreduce", "allgather", "reduce_scatter", "alltoall")),
                "DP": ("outer", ("allreduce", "allgather", "reduce_scatter", "alltoall")),
                "EP": ("outer", ("allreduce", "allgather", "reduce_scatter", "alltoall"))}
"""SimAI's groups and the link class each is priced on: tensor parallelism inside a node, data and expert
parallelism across nodes ('outer': inter, else spread); pipeline parallelism (PP) is the outer link's pingpong."""
SIMAI_NAMES = {"allreduce": "allreduce", "allgather": "allgather", "reduce_scatter": "reducescatter",
               "alltoall": "alltoall"}


@dataclass(frozen=True)
class Export:
    """One exported file's text, the fields its format needs that the calibration could not supply, and what was
    written from a source other than the level's own measurement (a substitution or a template's field)."""

    text: str
    missing: tuple[str, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Level:
    """One link class as a network level: its point-to-point latency and rate, and the devices it spans (the level's
    ranks together with all levels inside it)."""

    link: str
    alpha_s: float
    bytes_per_s: float
    devices: int


def _spans(cal: Calibration, links: list[str]) -> list[int]:
    """Devices each level spans, innermost first: intra its ranks per node; an outer level the machine's ranks, from
    spread's nodes x ranks per node, else inter's nodes x intra's ranks per node."""
    classes = cal.link_classes()
    per_node = int(classes["intra"]["ranks_per_node"]) if "intra" in classes else 1
    spread = classes.get("spread")
    outer = (int(spread["nodes"]) * int(spread["ranks_per_node"]) if spread
             else int(classes["inter"]["nodes"]) * per_node if "inter" in classes else per_node)
    return [per_node if link == "intra" else outer for link in links]


def levels(cal: Calibration, sizes: list[int] | None = None) -> tuple[list[Level], list[str]]:
    """The exportable link classes, innermost first, and a line for each one left out: a level needs its
    point-to-point (pingpong) model, whose alpha and beta are the link's latency and rate. `sizes`: the devices each
    exported level spans (--tier-sizes), else the calibration's machine (_spans)."""
    classes = cal.link_classes()
    links = [lk for lk in TIER_LINKS if lk in classes and not (lk == "spread" and "inter" in classes)]
    p2p = {lk: cal.result.p2p.get("pingpong", {}).get(lk) for lk in links}
    kept = [lk for lk in links if p2p[lk] is not None and p2p[lk].beta_s_per_byte > 0]
    missing = [f"{lk}: no pingpong model (sweep --ops pingpong on that link), so no latency or rate"
               for lk in links if lk not in kept]
    if not kept:
        raise UsageError("the calibration has no link class with a pingpong model: an export needs each link's "
                         "point-to-point latency and rate (sweep --ops pingpong)")
    if sizes is None:
        sizes = _spans(cal, kept)
    elif len(sizes) != len(kept):
        raise UsageError(f"--tier-sizes gives {len(sizes)} size(s) for {len(kept)} level(s) ({', '.join(kept)})")
    if any(b < 2 for b in sizes) or any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise UsageError(f"tier sizes {','.join(map(str, sizes))} ({', '.join(kept)}): each level must span at least "
                         f"2 devices and more than the level inside it; give the machine's with --tier-sizes N,...")
    return [Level(lk, max(p2p[lk].alpha_s, 0.0), 1.0 / p2p[lk].beta_s_per_byte, int(n))
            for lk, n in zip(kept, sizes)], missing


def model_link(cal: Calibration, op: str, link: str) -> str | None:
    """The link class whose model of `op` prices `link`'s level: its own, else for an outer level the other outer
    class's (inter and spread both cross the nodes' links); None without either."""
    for candidate in (link, *(lk for lk in OUTER_LINKS if link in OUTER_LINKS and lk != link)):
        if (op, candidate) in cal.result.models:
            return candidate
    return None


def _ring_factor(name: str) -> float | None:
    """k when the algorithm's bandwidth coefficient b(p) is k (p-1)/p, the shape Calculon's (scalar, offset -1)
    expresses; None otherwise (log2 p shapes)."""
    p = np.arange(2.0, 65.0)
    k = algorithm(name).b(p) * p / (p - 1)
    return float(k[0]) if np.allclose(k, k[0]) else None


def gemm_curve(g: GemmRate) -> list[list[float]]:
    """Calculon's GEMM efficiency curve, [[gflops, efficiency], ...] by falling size (a call of at least `gflops`
    GFLOP runs at that share of `tflops`), from commcal's model t = latency + flops / rate: each threshold, a power
    of two from 16 TFLOP down to 1 MFLOP, carries the efficiency of a call of its own size, the last also every
    smaller call's."""
    peak = g.peak_flops_per_s if g.peak_flops_per_s > 0 else g.flops_per_s
    latency = g.latency_s or 0.0
    curve: list[list[float]] = []
    for k in range(14, -11, -1):
        flops = 2.0 ** k * 1e9
        efficiency = min(flops / (latency + flops / g.flops_per_s) / peak, 1.0)
        if not curve or abs(efficiency - curve[-1][1]) > 1e-6:
            curve.append([2.0 ** k, round(efficiency, 6)])
    curve[-1][0] = 0
    return curve


def _number(x, low: float, high: float = float("inf"), low_open: bool = False, high_open: bool = False) -> bool:
    """x is a finite JSON number (not a boolean) in the range."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and np.isfinite(x) and \
        (x > low if low_open else x >= low) and (x < high if high_open else x <= high)


def _curve_problem(curve) -> str | None:
    """What is wrong with a Calculon efficiency curve: [[threshold, efficiency], ...], thresholds falling to 0 (so
    that every size is covered), efficiencies in (0, 1]."""
    if not isinstance(curve, list) or not curve or not all(isinstance(p, list) and len(p) == 2 for p in curve):
        return "is not a list of [threshold, efficiency] pairs"
    if not all(_number(t, 0) and _number(e, 0, 1, low_open=True) for t, e in curve):
        return "holds a threshold below 0 or an efficiency outside (0, 1]"
    if any(a[0] <= b[0] for a, b in zip(curve, curve[1:])) or curve[-1][0] != 0:
        return "has thresholds that do not fall to 0"
    return None


def template_problem(template: dict) -> str | None:
    """The first field of a Calculon system file that export would copy and Calculon's reader would refuse (its
    types and ranges: processing mode, processors' and memories' rates and curves, each tier's must_be_filled and
    processor_usage), as 'key: what is wrong'; None when every copied field is one Calculon takes."""
    checks: list[tuple[str, object]] = []
    if "processing_mode" in template and template["processing_mode"] not in ("roofline", "no_overlap"):
        return "processing_mode: is neither roofline nor no_overlap"
    for name in ("matrix", "vector"):
        if name in template and not isinstance(template[name], dict):
            return f"{name}: is not an object of datatypes"
        for dt, entry in template.get(name, {}).items():
            if not isinstance(entry, dict) or not _number(entry.get("tflops"), 0, low_open=True):
                return f"{name}.{dt}: has no tflops above 0"
            checks.append((f"{name}.{dt}.gflops_efficiency", entry.get("gflops_efficiency")))
    for name in ("mem1", "mem2"):
        if name in template:
            mem = template[name]
            if not isinstance(mem, dict) or not _number(mem.get("GiB"), 0) or \
                    not _number(mem.get("GBps"), 0, low_open=True):
                return f"{name}: lacks GiB >= 0 or GBps above 0"
            checks.append((f"{name}.MB_efficiency", mem.get("MB_efficiency")))
    networks = template.get("networks", [])
    if not isinstance(networks, list) or not all(isinstance(n, dict) for n in networks):
        return "networks: is not a list of objects"
    for i, tier in enumerate(networks):
        if "must_be_filled" in tier and not isinstance(tier["must_be_filled"], bool):
            return f"networks[{i}].must_be_filled: is not true or false"
        if "processor_usage" in tier and not _number(tier["processor_usage"], 0, 1, high_open=True):
            return f"networks[{i}].processor_usage: is not a number in [0, 1)"
    for key, curve in checks:
        why = _curve_problem(curve)
        if why:
            return f"{key}: {why}"
    return None


def calculon(cal: Calibration, sizes: list[int] | None = None, template: dict | None = None) -> Export:
    """Calculon's system JSON: a network tier per level (bandwidth in GB/s at efficiency 1, the measured rate;
    latency in s; size the devices the tier spans; op scalars and offsets from the fitted algorithms) and a matrix
    entry per GEMM dtype Calculon knows (peak TFLOP/s and the efficiency curve of commcal's model). `template`: a
    Calculon system file whose unmeasured fields (vector, memories, processing mode, each tier's must_be_filled and
    processor_usage) complete the file, so that Calculon loads it."""
    tiers, missing = levels(cal, sizes)
    notes: list[str] = []
    base = dict(template or {})
    base_tiers = base.get("networks") if isinstance(base.get("networks"), list) else []
    networks = []
    for i, lv in enumerate(tiers):
        ops: dict[str, list] = {"p2p": [1.0, None]}
        for name, op in CALCULON_OPS.items():
            link = model_link(cal, op, lv.link)
            if link is None:
                missing.append(f"networks[{lv.link}].ops.{name}: no {op} model on {lv.link}")
                continue
            if link != lv.link:
                notes.append(f"networks[{lv.link}].ops.{name}: {link}'s {op} model (none on {lv.link})")
            model = cal.result.models[(op, link)]
            k = _ring_factor(model.algorithm)
            ratio = model.beta_s_per_byte * lv.bytes_per_s
            if k is None:   # log2 p bandwidth shapes: fixed at the level's size
                ops[name] = [float(algorithm(model.algorithm).b(lv.devices)) * ratio, 0]
            else:
                ops[name] = [k * ratio, -1]
        tier = {"bandwidth": lv.bytes_per_s / 1e9, "efficiency": 1.0, "size": lv.devices,
                "latency": lv.alpha_s, "ops": ops}
        theirs = base_tiers[i] if i < len(base_tiers) and isinstance(base_tiers[i], dict) else {}
        for key in CALCULON_KEYS:
            if key in theirs:
                tier[key] = theirs[key]
                notes.append(f"networks[{lv.link}].{key}: the template's networks[{i}]")
            else:
                missing.append(f"networks[{lv.link}].{key}")
        networks.append(tier)
    matrix = {dt: {"tflops": (g.peak_flops_per_s if g.peak_flops_per_s > 0 else g.flops_per_s) / 1e12,
                   "gflops_efficiency": gemm_curve(g)}
              for dt, g in sorted(cal.result.gemm.items()) if dt in CALCULON_DTYPES and g.flops_per_s > 0}
    theirs = base.get("matrix") if isinstance(base.get("matrix"), dict) else {}
    notes += [f"matrix.{dt}: the template's" for dt in theirs if dt not in matrix]
    if not matrix and not theirs:
        missing.append("matrix: the calibration has no GEMM rate of a dtype Calculon knows "
                       f"({', '.join(CALCULON_DTYPES)})")
    doc = {**base, "matrix": {**theirs, **matrix}, "networks": networks}
    if not doc["matrix"]:
        del doc["matrix"]
    for key in ("vector", "mem1", "mem2", "processing_mode"):
        if key in base:
            notes.append(f"{key}: the template's")
        else:
            missing.append(key)
    return Export(json.dumps(doc, indent=2) + "\n", tuple(missing), tuple(notes))


def _yaml_list(values) -> str:
    return "[ " + ", ".join(str(v) for v in values) + " ]"


def astra_sim(cal: Calibration, topology: list[str] | None, sizes: list[int] | None = None) -> Export:
    """ASTRA-sim's analytical network YAML: one dimension per level (npus_count: the devices of that level per unit
    of the next; bandwidth in its GB/s of 2^30 B; latency in ns per hop, so that a message between two neighbours
    of the dimension costs the pingpong alpha). The topology of each dimension is not measured: it must be given."""
    tiers, missing = levels(cal, sizes)
    if not topology or len(topology) != len(tiers):
        raise UsageError(f"astra-sim needs --topology with one of {', '.join(ASTRA_TOPOLOGIES)} for each of the "
                         f"{len(tiers)} dimension(s) ({', '.join(lv.link for lv in tiers)}): a calibration does not "
                         f"measure the topology")
    bad = [t for t in topology if t not in ASTRA_TOPOLOGIES]
    if bad:
        raise UsageError(f"--topology {bad[0]!r} is not one of {', '.join(ASTRA_TOPOLOGIES)}")
    spans = [lv.devices for lv in tiers]
    if any(b % a for a, b in zip(spans, spans[1:])):
        raise UsageError(f"tier sizes {','.join(map(str, spans))}: ASTRA-sim's dimensions multiply, so each level "
                         f"must span a whole number of the level inside it (--tier-sizes N,...)")
    counts = [spans[0]] + [b // a for a, b in zip(spans, spans[1:])]
    text = (f"topology: {_yaml_list(topology)}\n"
            f"npus_count: {_yaml_list(counts)}\n"
            f"bandwidth: {_yaml_list(round(lv.bytes_per_s / GIB, 6) for lv in tiers)}  # GB/s, 1 GB = 2^30 B\n"
            f"latency: {_yaml_list(round(lv.alpha_s * 1e9 / ASTRA_HOPS[t], 3) for lv, t in zip(tiers, topology))}"
            f"  # ns per hop\n")
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
    """SimAI's busbw.yaml: busbw in its GB/s of 2^30 B per group (TP on intra, DP and EP on the outer link) and
    collective, null where the calibration has no model (SimAI then holds -1 there: a workload that uses it is
    priced at a negative time, so each one is named); PP is the outer link's pingpong rate."""
    classes = cal.link_classes()
    outer = "inter" if "inter" in classes else "spread" if "spread" in classes else None
    lines, missing, notes = ["commcal"], [], []
    for group, (where, ops) in SIMAI_GROUPS.items():
        link = "intra" if where == "intra" else outer
        lines.append(f"{group}:")
        for op in ops:
            used = model_link(cal, op, link) if link else None
            bw = busbw(cal, op, used) if used else None
            if bw is None:
                missing.append(f"{group}.{SIMAI_NAMES[op]}: no {op} model on {link or 'an inter-node link'} "
                               f"(written null, which SimAI reads as -1)")
            elif used != link:
                notes.append(f"{group}.{SIMAI_NAMES[op]}: {used}'s {op} model (none on {link})")
            lines.append(f"{SIMAI_NAMES[op]},: {'null' if bw is None else round(bw / GIB, 6)}")
    q = cal.result.p2p.get("pingpong", {}).get(outer) if outer else None
    pp = None if q is None else q.bandwidth_bytes_per_s
    if not pp:
        missing.append("PP.busbw: no pingpong model on an inter-node link")
    lines += ["PP:", f"busbw: {round(pp / GIB, 6) if pp else 'null'}"]
    return Export("\n".join(lines) + "\n", tuple(missing), tuple(notes))
