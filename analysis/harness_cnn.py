"""A CNN as the pipeline executor's stack (analysis.harness_pipeline): ParaDL's pipeline strategy run for real. Each
layer runs the kernels of its replicated schedule (strategy "-" on one device, the same Compute steps a single-process
network run uses), so a stage is a slice of the network on whole micro-batches and the tensors between stages change
shape (NCHW before the flatten, rows x features after). Nothing here imports MPI."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.conv import BatchNorm2d
from analysis.harness_chain import network_data
from analysis.layers import Compute, Schedule, Strategy
from analysis.mesh import Mesh
from analysis.models import Model
from microbench.errors import UsageError

ONE = Mesh((1,), 1)


class ScheduledLayer:
    """A layer whose forward and backward are its schedule's Compute steps on a fresh environment: X (and W) in, Y
    out; dY in, dX (and dW) out."""

    def __init__(self, schedule: Schedule, params: dict, xp=np):
        self.schedule, self.params, self.xp = schedule, params, xp

    def forward(self, x):
        env = {"X": x, **self.params}
        for step in self.schedule.forward:
            step.run(self.xp, env)
        return env["Y"], env

    def backward(self, env, dy):
        env["dY"] = dy
        for step in self.schedule.backward:
            step.run(self.xp, env)
        return env.get("dX"), {name: env[f"d{name}"] for name in self.params}


@dataclass(frozen=True)
class CnnStack:
    """A chain of layers (a cnn model: convs, pools, activations, flatten, dense head) as a pipeline stack: batch
    rows of one sample each (seq 1), weights W per weighted layer, no tensor parallelism. Batch norm is refused:
    its statistics would be the micro-batch's, not the batch's the reference takes."""

    model: Model

    def __post_init__(self) -> None:
        if any(isinstance(layer, BatchNorm2d) for layer in self.model.layers):
            raise UsageError(f"model {self.model.name}: the pipeline runs no batch norm (its statistics would span a "
                             f"micro-batch, not the batch)")

    @property
    def layers(self) -> int:
        return len(self.model.layers)

    @property
    def batch(self) -> int:
        return self.model.layers[0].in_shape[0]

    seq = 1

    def shape(self, i: int, rows: int) -> tuple[int, ...]:
        """The input of layer i (the output of the last for i = layers) for `rows` samples."""
        layers = self.model.layers
        return (rows, *(layers[i].in_shape if i < len(layers) else layers[-1].out_shape)[1:])

    def data(self, seed: int) -> dict:
        """analysis.harness_chain's seeded network data, as the executor takes it."""
        d = network_data(self.model, seed)
        weights = [{"W": d[f"{i}:W"]} if f"{i}:W" in d else {} for i in range(self.layers)]
        return {"weights": weights, "X": d["X"], "R": d["dY"]}

    def shard(self, i: int, arrays: dict, t: int, index: int) -> dict:
        if t != 1:
            raise ValueError(f"model {self.model.name}: the CNN pipeline runs without tensor parallelism (t={t})")
        return arrays

    def layer(self, i: int, params: dict, allreduce, xp=np) -> ScheduledLayer:
        layer = self.model.layers[i]
        sched = layer.schedule(Strategy(("-",)), ONE, need_dx=i > 0)
        if not sched.feasible or not all(isinstance(s, Compute) for s in sched.forward + sched.backward):
            raise ValueError(f"layer {layer.name}: no replicated schedule of local kernels ({sched.reason})")
        return ScheduledLayer(sched, params, xp)
