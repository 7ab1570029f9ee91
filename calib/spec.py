"""A calibration from a hardware spec, for machines not measured: link tiers (bandwidth, latency, efficiency,
devices per tier) and a device (peak rate per dtype with a GEMM efficiency curve, memory size and bandwidth),
written into the calibration schema with its provenance marked as a spec. Pure. docs/training.md#spec documents
the file; calib/selene.spec.json is an example built from public figures.

Mapping: the first tier (the node) prices the intra link class, the second the inter and spread classes; every
operation gets its default algorithm model (ring allreduce, ring allgather, ...) with alpha the tier latency and
beta 1/(bandwidth x efficiency), so bus bandwidth is the tier's effective rate. A tier's bandwidth is per device
with every device of a node using it at once (groups_per_node = devices per node). The GEMM curve
efficiency(f) = max_efficiency f / (f + half_flops) for a call of f flops is the calibration's own GEMM model,
t = latency_s + f / flops_per_s, with flops_per_s = peak x max_efficiency and latency_s = half_flops / flops_per_s.
The memory bandwidth times its efficiency is the local copy rate (bytes read and written)."""

from __future__ import annotations

import hashlib
import json
import math
from datetime import datetime, timezone
from pathlib import Path

from calib.algorithms import CANDIDATES, P2P_OPS
from calib.result import CalibrationResult, CopyRate, GemmRate, p2p_of
from calib.synthetic import TrueModel, exact_models, link_shape
from microbench.errors import UsageError
from microbench.jsonfile import input_path, read_json
from microbench.limits import MAX_RANKS
from microbench.links import meaning
from microbench.ops import itemsize

SPEC_SCHEMA = "commcal.spec"
SPEC_VERSION = 1
SPEC_KEYS = {"schema", "version", "machine", "description", "sources", "backend", "tiers", "device"}
TIER_KEYS = {"name", "devices", "bandwidth_GBps", "efficiency", "latency_us"}
DEVICE_KEYS = {"memory_GiB", "memory_GBps", "memory_efficiency", "peak_tflops", "gemm_max_efficiency",
               "gemm_half_gflop", "sms", "gemm_tile"}
OPTIONAL_KEYS = {"description", "sources", "sms", "gemm_tile"}
"""Keys a spec may leave out: a device without `sms` and `gemm_tile` is priced without wave quantization."""
SIZES = tuple(2 ** k for k in range(3, 35))     # 8 B .. 16 GiB: the range the models state they hold over


RATES = (1e-9, 1e9)
"""The range a spec's rates and sizes (GB/s, GiB, TFLOP/s, GFLOP) must lie in: beyond it their reciprocals leave
the floats' range."""


def _number(obj: dict, key: str, where: str, low: float = 0.0, high: float = math.inf) -> float:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not low < v <= high:
        raise UsageError(f"{where}: key '{key}' must be a number in ({low:g}, {high:g}], not {v!r}")
    return float(v)


def _keys(obj, allowed: set[str], where: str) -> dict:
    if not isinstance(obj, dict):
        raise UsageError(f"{where} must be a JSON object")
    extra, missing = sorted(set(obj) - allowed), sorted(allowed - set(obj) - OPTIONAL_KEYS)
    if extra or missing:
        raise UsageError(f"{where}: {'unknown' if extra else 'missing'} key '{(extra or missing)[0]}'")
    return obj


def from_spec(spec: dict, path: str = "spec") -> CalibrationResult:
    """The calibration a spec describes; any problem with the spec is one UsageError line naming the key."""
    _keys(spec, SPEC_KEYS, path)
    if spec["schema"] != SPEC_SCHEMA or spec["version"] != SPEC_VERSION or isinstance(spec["version"], bool):
        raise UsageError(f"{path}: schema/version must be {SPEC_SCHEMA!r}/{SPEC_VERSION}")
    tiers = spec["tiers"]
    if not isinstance(tiers, list) or len(tiers) not in (1, 2):
        raise UsageError(f"{path}: 'tiers' must list one or two link tiers (the node, then the network)")
    for i, tier in enumerate(tiers):
        _keys(tier, TIER_KEYS, f"{path}: tiers[{i}]")
        _number(tier, "bandwidth_GBps", f"{path}: tiers[{i}]", *RATES)
        _number(tier, "latency_us", f"{path}: tiers[{i}]", high=1e9)
        _number(tier, "efficiency", f"{path}: tiers[{i}]", RATES[0], 1.0)
        if not isinstance(tier["devices"], int) or not 2 <= tier["devices"] <= MAX_RANKS:
            raise UsageError(f"{path}: tiers[{i}]: key 'devices' must be an integer from 2 to {MAX_RANKS}")
    per_node = tiers[0]["devices"]
    if len(tiers) == 2 and (tiers[1]["devices"] <= per_node or tiers[1]["devices"] % per_node):
        raise UsageError(f"{path}: tiers[1].devices ({tiers[1]['devices']}) must be a multiple of a node's {per_node} "
                         f"(tiers[0].devices) and more than it: the network spans two nodes or more")
    device = _keys(spec["device"], DEVICE_KEYS, f"{path}: device")
    for key in ("memory_GiB", "memory_GBps", "gemm_half_gflop"):
        _number(device, key, f"{path}: device", *RATES)
    for key in ("memory_efficiency", "gemm_max_efficiency"):
        _number(device, key, f"{path}: device", RATES[0], 1.0)
    wave = _wave(device, f"{path}: device")
    peaks = device["peak_tflops"]
    if not isinstance(peaks, dict) or not peaks:
        raise UsageError(f"{path}: device.peak_tflops must map dtypes to TFLOP/s")
    for dtype in peaks:
        _number(peaks, dtype, f"{path}: device.peak_tflops", *RATES)
    for key in ("machine", "description"):
        if not isinstance(spec.get(key, ""), str):
            raise UsageError(f"{path}: key '{key}' must be a string")
    sources = spec.get("sources", [])
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        raise UsageError(f"{path}: key 'sources' must list strings (where the figures come from)")
    if spec["backend"] not in ("mpi", "mpi-cuda", "nccl"):
        raise UsageError(f"{path}: key 'backend' must be mpi, mpi-cuda or nccl")

    classes = {"intra": tiers[0], **({"inter": tiers[1], "spread": tiers[1]} if len(tiers) == 2 else {})}
    links, models = {}, {}
    for link, tier in classes.items():
        procs = _procs(link, tier["devices"], per_node)
        shapes = [dict(zip(("procs", "nodes", "ranks_per_node"), (p, *_shape(link, p, per_node)))) for p in procs]
        links[link] = {"meaning": meaning(link), "nodes": max(s["nodes"] for s in shapes),
                       "ranks_per_node": max(s["ranks_per_node"] for s in shapes), "procs": procs, "shapes": shapes,
                       "groups_per_node": 1 if link == "intra" else per_node}
        line = TrueModel.line(tier["latency_us"] * 1e-6, 1.0 / (tier["bandwidth_GBps"] * 1e9 * tier["efficiency"]))
        models.update({(op, link): line for op in CANDIDATES})
    built = exact_models(models, {lk: v["procs"] for lk, v in links.items()}, SIZES,
                         f"from the hardware spec {path}, not measured")
    gemm = {}
    for dtype, tflops in peaks.items():
        peak = tflops * 1e12
        rate = peak * device["gemm_max_efficiency"]
        half = device["gemm_half_gflop"] * 1e9
        n90 = (9 * half / 2) ** (1 / 3)               # square GEMM at 90% of the curve's maximum
        gemm[dtype] = GemmRate(rate, peak, float(n90 * n90 * _itemsize(dtype, path)), 1, half / rate, per_node, *wave)
    copy = CopyRate(device["memory_GBps"] * 1e9 * device["memory_efficiency"], 0.0, 1, per_node)
    text = json.dumps(spec, sort_keys=True)
    run = {"run_id": f"spec-{spec['machine']}", "dir": path, "date": datetime.now(timezone.utc).isoformat(),
           "machine": spec["machine"], "hosts": [], "mpi_library": "none: a hardware spec, not measured",
           "versions": {"commcal_spec": str(SPEC_VERSION)},
           "origin": {"spec": {"file": path, "sha256": hashlib.sha256(text.encode()).hexdigest(),
                               "description": spec.get("description", ""),
                               "sources": [str(s) for s in spec.get("sources", [])]}}}
    return CalibrationResult(
        created_utc=run["date"], backend=spec["backend"],
        fit={"method": "wls", "folds": 0, "max_segments": 1, "target_median_abs_rel_err_ge_4KiB": 0.05,
             "target_median_abs_rel_err": 0.15, "commcal_version": "spec"},
        provenance={"run_ids": [run["run_id"]], "runs": [run]}, link_classes=links, models=built, hockney=(),
        p2p=p2p_of(built, P2P_OPS), gemm=gemm, warnings=(f"from the hardware spec {path}, not measured",), copy=copy,
        memory_bytes=device["memory_GiB"] * 2 ** 30)


def _wave(device: dict, where: str) -> tuple:
    """(tiles per wave, tile rows, tile cols) from `sms` and `gemm_tile` (one output tile per SM at a time), or
    Nones where the spec gives neither."""
    if "sms" not in device and "gemm_tile" not in device:
        return (None, None, None)
    sms, tile = device.get("sms"), device.get("gemm_tile")
    if not (isinstance(sms, int) and not isinstance(sms, bool) and sms >= 1):
        raise UsageError(f"{where}: key 'sms' must be a positive integer (with gemm_tile), not {sms!r}")
    if not (isinstance(tile, list) and len(tile) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                               and x >= 1 for x in tile)):
        raise UsageError(f"{where}: key 'gemm_tile' must be [rows, cols] of positive integers (with sms), not {tile!r}")
    return (sms, *tile)


def _itemsize(dtype: str, where: str) -> int:
    try:
        return itemsize(dtype)
    except TypeError:
        raise UsageError(f"{where}: unknown dtype {dtype!r} in device.peak_tflops") from None


def _procs(link: str, devices: int, per_node: int) -> list[int]:
    """Process counts the tier's models state: powers of two up to its devices (and the count itself)."""
    top = devices if link != "intra" else per_node
    return sorted({*(2 ** k for k in range(1, int(math.log2(top)) + 1)), top} - ({1} if link == "intra" else set()))


def _shape(link: str, procs: int, per_node: int) -> tuple[int, int]:
    if link == "spread":
        return max(2, -(-procs // per_node)), min(per_node, max(1, procs // 2))
    return link_shape(link, procs)


def load_spec(path) -> CalibrationResult:
    """Read a spec file (or a shipped one by name, e.g. 'selene') into its calibration."""
    return from_spec(read_spec(path), str(path))


def read_spec(path) -> dict:
    """The JSON of a spec file, or of a shipped one by name (e.g. 'selene')."""
    p = input_path(path)
    if not p.exists() and p.suffix == "":
        shipped = Path(__file__).with_name(f"{p.name}.spec.json")
        p = shipped if shipped.exists() else p
    return read_json(p, "spec", shown=path)
