"""Prices plan steps and local computations from a calibration (anything with calib.calibration's
predict_seconds, gemm_flops_per_s, gemm_latency_s and groups_per_node). A collective on a mesh axis is
priced by the calibration entry of the axis's link class at the axis's group size, with the nccl-tests
size of the step; a local computation costs the GEMM latency plus the longer of its flops at the GEMM rate
and its memory traffic at the local copy rate (a roofline); each local layout copy that a step makes (a
split off the outer dimension, say) costs the copy latency plus its bytes read and written at that rate,
in the step's own time (communication or compute, as the harness measures it). A collective after a local
computation in its schedule (after_compute) is priced by the calibration's after-compute models where it has them
(`commcal fit --after-compute`): on a time-shared host such calls run slower than back to back. Calibrations without a
copy rate (before version 3) price no traffic and no copies.
The mesh is placed on the calibration's switch levels (Mesh.placed, Calibration.switch_spans): an axis whose groups
cross racks is priced on that level's class (inter2, ...), one within a rack on inter.
Fallback when the calibration lacks that (op, link) (microbench.links.fallback): intra -> spread -> inter;
inter -> spread -> intra; spread -> inter -> intra; a switch level to the nearest other level, then spread and intra
(the link actually used is what breakdowns report); an op it lacks on every link costs infinity. Each such
(op, axis) is a Fallback, which the front doors report (and --strict refuses).

Link sharing: all groups of a mesh axis run at once. Where k of them have ranks on one node and the priced
link leaves the node (inter, spread), they share that node's network link (`nics_per_node` of them), so
each moves its bytes at 1/ceil(k / nics) of the bandwidth. The calibration measured g groups per node at
once (1 unless swept with --concurrent), already sharing 1/ceil(g / nics). An affine piece t(n) = alpha +
beta n then costs t(s n) with s = ceil(k / nics) / ceil(g / nics): the latency is paid once and the
bandwidth term s times, so the calibration is asked at s times the size."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass

import numpy as np

from analysis.mesh import Mesh
from microbench.links import fallback
from microbench.ops import itemsize



@dataclass(frozen=True)
class Fallback:
    """A collective whose wanted link class the calibration lacks: `used` prices it instead (None: no class has
    the op, so it costs infinity). `axis`: the mesh axis (None for a bare `predict --op`)."""

    op: str
    axis: int | None
    wanted: str
    used: str | None

    def to_dict(self) -> dict:
        return asdict(self)


def resolve(calibration, op: str, wanted: str) -> str | None:
    """The first link class in `wanted`'s fallback order that the calibration has `op` on, or None."""
    return next((lk for lk in fallback(wanted) if calibration.has(op, lk)), None)


class Pricer:
    def __init__(self, calibration, mesh: Mesh, dtype: str = "float32", nics_per_node: int = 1, profile=None):
        self.cal = calibration
        self.profile = profile
        self.dtype = dtype
        self.mesh = mesh.placed(calibration.switch_spans())
        self.flops_per_s = calibration.gemm_flops_per_s(dtype)
        self.compute_latency_s = calibration.gemm_latency_s(dtype)
        self.itemsize = itemsize(dtype)
        copy = calibration.copy_cost()
        self.copy_latency_s, self.copy_bytes_per_s = copy if copy else (0.0, math.inf)
        self.nics_per_node = nics_per_node
        self._link: dict[tuple[str, int], str | None] = {}

    def sharing(self, link: str, axis: int) -> float:
        """The axis's groups per network link of a node over the calibration's (1 within a node)."""
        if link == "intra":
            return 1.0
        per_link = lambda groups: -(-groups // self.nics_per_node)  # noqa: E731
        return per_link(self.mesh.axes[axis].groups_per_node) / per_link(self.cal.groups_per_node(link))

    def link(self, op: str, axis: int) -> str | None:
        """The calibration link that prices `op` on `axis` (after fallback), or None."""
        key = (op, axis)
        if key not in self._link:
            self._link[key] = resolve(self.cal, op, self.mesh.axes[axis].link)
        return self._link[key]

    def fallbacks(self, steps=None) -> list[Fallback]:
        """Every (op, axis) not priced by its axis's own link class, by axis and op: among the collectives of
        `steps`, or (None) among all priced so far."""
        pairs = self._link if steps is None else {(st.op, st.axis) for st in steps
                                                  if not hasattr(st, "flops") and st.is_comm}
        found = (Fallback(op, axis, self.mesh.axes[axis].link, self.link(op, axis)) for op, axis in pairs)
        return sorted((f for f in found if f.used != f.wanted), key=lambda f: (f.axis, f.op))

    def seconds(self, op: str, axis: int, size_bytes, after: bool = False) -> np.ndarray:
        """Vectorised seconds of `op` on `axis` for nccl-tests sizes `size_bytes`; `after`: the calls follow a
        local computation."""
        size_bytes = np.asarray(size_bytes, dtype=float)
        link = self.link(op, axis)
        if link is None:
            return np.full(size_bytes.shape, np.inf)
        return self.cal.predict_seconds(op, link, self.mesh.shape[axis], self.priced_bytes(op, axis, size_bytes), after)

    def priced_bytes(self, op: str, axis: int, size_bytes):
        """The size the calibration is read at for `op` on `axis`: `size_bytes` times the link's sharing (a link
        carrying k of the axis's groups at once moves each group's bytes as k times as many of one)."""
        link = self.link(op, axis)
        return size_bytes * (self.sharing(link, axis) if link is not None else 1.0)

    def compute_seconds(self, flops: float, elements: float = 0.0) -> float:
        """A local computation: the GEMM latency plus the longer of flops at the GEMM rate and the traffic of
        `elements` at the copy rate."""
        traffic_s = elements * self.itemsize / self.copy_bytes_per_s
        return self.compute_latency_s + max(flops / self.flops_per_s, traffic_s)

    def kernel_seconds(self, step) -> float:
        """A Compute step: its profiled seconds where the profile has its kernel, else compute_seconds' roofline."""
        if self.profile is not None and (t := self.profile.seconds(step, self.dtype)) is not None:
            return t
        return self.compute_seconds(step.flops, step.elements)

    def profiled(self, steps) -> tuple[int, int]:
        """(Compute steps the profile prices, Compute steps) among `steps`."""
        computes = [st for st in steps if hasattr(st, "flops")]
        if self.profile is None:
            return 0, len(computes)
        return sum(self.profile.seconds(st, self.dtype) is not None for st in computes), len(computes)

    def traffic_seconds(self, elements: float) -> float:
        """One memory-bound call that reads and writes `elements` in all: the copy model's latency plus its bytes
        at the copy rate."""
        return self.copy_latency_s + elements * self.itemsize / self.copy_bytes_per_s

    def copies_seconds(self, step) -> float:
        """The local layout copies a redistribution step makes (copy_calls_seconds of their count and elements)."""
        return self.copy_calls_seconds(len(step.copies), sum(step.copies))

    def copy_calls_seconds(self, calls: int, elements: float) -> float:
        """`calls` local layout copies of `elements` in all, each a call reading and writing its elements."""
        return calls * self.copy_latency_s + 2.0 * elements * self.itemsize / self.copy_bytes_per_s if calls else 0.0

    def step_seconds(self, step, after: bool = False) -> float:
        """One schedule entry's predicted seconds, as price() counts it; `after`: it follows a local computation
        (after_compute tells)."""
        if hasattr(step, "flops"):
            return self.kernel_seconds(step)
        comm = float(self.seconds(step.op, step.axis, [step.size_bytes], after)[0]) if step.is_comm else 0.0
        return comm + self.copies_seconds(step)

    def price(self, step_lists) -> tuple[np.ndarray, np.ndarray]:
        """(communication seconds, compute seconds) of each list of steps, priced in one vectorised pass
        per (op, axis); a step's layout copies count where the harness measures them. A sum past a double's
        range prices inf (the caller refuses it), without numpy's overflow warning."""
        with np.errstate(over="ignore"):
            return self._price(step_lists)

    def _price(self, step_lists) -> tuple[np.ndarray, np.ndarray]:
        groups: dict[tuple[str, int, bool], tuple[list, list]] = defaultdict(lambda: ([], []))
        comm, compute = np.zeros(len(step_lists)), np.zeros(len(step_lists))
        for i, steps in enumerate(step_lists):
            for st, after in zip(steps, after_compute(steps)):
                if hasattr(st, "flops"):
                    compute[i] += self.kernel_seconds(st)
                    continue
                if st.is_comm:
                    idx, size = groups[(st.op, st.axis, after)]
                    idx.append(i)
                    size.append(st.size_bytes)
                if st.copies:
                    (comm if st.is_comm else compute)[i] += self.copies_seconds(st)
        for (op, axis, after), (idx, size) in groups.items():
            comm += np.bincount(idx, weights=self.seconds(op, axis, size, after), minlength=len(step_lists))
        return comm, compute

    def breakdown(self, steps) -> dict[str, float]:
        """Seconds per "collective/link" (the link that priced it), plus "compute"."""
        out: dict[str, float] = defaultdict(float)
        for st, after in zip(steps, after_compute(steps)):
            if hasattr(st, "flops") or not st.is_comm:
                out["compute"] += self.step_seconds(st)
            else:
                out[f"{st.op}/{self.link(st.op, st.axis)}"] += self.step_seconds(st, after)
        return dict(out)


def after_compute(steps) -> list[bool]:
    """For each entry of a schedule (in execution order), whether the last computation or collective before it is a
    local computation: such a collective is priced by the calibration's after-compute models where it has them, one
    after another collective by the main ones. A schedule runs again and again (training steps, validate's
    iterations), so its first entries follow its last; layout steps (slices, relabels) are local work, passed over."""
    kinds = ["compute" if hasattr(st, "flops") else "comm" if getattr(st, "is_comm", False) else None
             for st in steps]
    last = next((k for k in reversed(kinds) if k), None)
    out = []
    for kind in kinds:
        out.append(last == "compute")
        last = kind or last
    return out
