"""Prices plan steps and local computations from a calibration (anything with calib.calibration's
predict_seconds, gemm_flops_per_s, gemm_latency_s and groups_per_node). A collective on a mesh axis is
priced by the calibration entry of the axis's link class at the axis's group size, with the nccl-tests
size of the step; a local computation costs the GEMM latency plus its flops at the GEMM rate.
Fallback when the calibration lacks that (op, link): intra -> spread -> inter; inter -> spread -> intra;
spread -> inter -> intra (the link actually used is what breakdowns report); an op it lacks on every link
costs infinity.

Link sharing: all groups of a mesh axis run at once. Where k of them have ranks on one node and the priced
link leaves the node (inter, spread), they share that node's network link (`nics_per_node` of them), so
each moves its bytes at 1/ceil(k / nics) of the bandwidth. The calibration measured g groups per node at
once (1 unless swept with --concurrent), already sharing 1/ceil(g / nics). An affine piece t(n) = alpha +
beta n then costs t(s n) with s = ceil(k / nics) / ceil(g / nics): the latency is paid once and the
bandwidth term s times, so the calibration is asked at s times the size."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from analysis.mesh import Mesh

FALLBACK = {"intra": ("intra", "spread", "inter"), "inter": ("inter", "spread", "intra"),
            "spread": ("spread", "inter", "intra")}


class Pricer:
    def __init__(self, calibration, mesh: Mesh, dtype: str = "float32", nics_per_node: int = 1):
        self.cal = calibration
        self.mesh = mesh
        self.flops_per_s = calibration.gemm_flops_per_s(dtype)
        self.compute_latency_s = calibration.gemm_latency_s(dtype)
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
            want = self.mesh.axes[axis].link
            self._link[key] = next((lk for lk in FALLBACK[want] if self.cal.has(op, lk)), None)
        return self._link[key]

    def seconds(self, op: str, axis: int, size_bytes) -> np.ndarray:
        """Vectorised seconds of `op` on `axis` for nccl-tests sizes `size_bytes`."""
        size_bytes = np.asarray(size_bytes, dtype=float)
        link = self.link(op, axis)
        if link is None:
            return np.full(size_bytes.shape, np.inf)
        return self.cal.predict_seconds(op, link, self.mesh.shape[axis], size_bytes * self.sharing(link, axis))

    def compute_seconds(self, flops):
        """A local computation: the calibration's per-call latency plus its flops at the GEMM rate."""
        return self.compute_latency_s + np.asarray(flops, dtype=float) / self.flops_per_s

    def price(self, step_lists) -> tuple[np.ndarray, np.ndarray]:
        """(communication seconds, compute seconds) of each list of steps, priced in one vectorised pass
        per (op, axis)."""
        groups: dict[tuple[str, int], tuple[list, list]] = defaultdict(lambda: ([], []))
        flops, calls = np.zeros(len(step_lists)), np.zeros(len(step_lists))
        for i, steps in enumerate(step_lists):
            for st in steps:
                if hasattr(st, "flops"):
                    flops[i] += st.flops
                    calls[i] += 1
                elif st.is_comm:
                    idx, size = groups[(st.op, st.axis)]
                    idx.append(i)
                    size.append(st.size_bytes)
        comm = np.zeros(len(step_lists))
        for (op, axis), (idx, size) in groups.items():
            comm += np.bincount(idx, weights=self.seconds(op, axis, size), minlength=len(step_lists))
        return comm, calls * self.compute_latency_s + flops / self.flops_per_s

    def breakdown(self, steps) -> dict[str, float]:
        """Seconds per "collective/link" (the link that priced it), plus "compute"."""
        out: dict[str, float] = defaultdict(float)
        for st in steps:
            if hasattr(st, "flops"):
                out["compute"] += float(self.compute_seconds(st.flops))
            elif st.is_comm:
                out[f"{st.op}/{self.link(st.op, st.axis)}"] += float(self.seconds(st.op, st.axis, [st.size_bytes])[0])
        return dict(out)
