"""The MPI part of ParaDL's pipeline strategy in `commcal validate CAL --model CNN --strategies ...,pipeline`: the
network cut into the stages analysis.paradl.pipeline prices (the mesh's devices as stages balanced by time, GPipe,
PIPELINE_MICRO_BATCHES micro-batches: what `search` prints), run for real by analysis.harness_pipeline's executor on
a CnnStack, its outputs and weight gradients checked against one float64 process, its pipeline phase (every pass
and message of the schedule; no optimizer, which the model does not price) timed like any strategy."""

from __future__ import annotations

import numpy as np

from analysis.harness import TOLERANCE, Bench, NumericsError
from analysis.harness_cnn import CnnStack
from analysis.harness_comm import Collectives, job_mesh
from analysis.harness_exec import Item, Program, Runner
from analysis.harness_pipeline import Place, TrainStep, reference
from analysis.options import nics_per_node
from analysis.paradl import PIPELINE, PIPELINE_MICRO_BATCHES, PIPELINE_SCHEDULE, Pipeline, pipeline
from analysis.training import parse_config


def predict(args, spec: str, model, cal, mesh) -> Pipeline:
    """ParaDL's pipeline of network `spec` over the mesh's devices, as search prices it (UsageError if it cannot be
    priced or run)."""
    CnnStack(model)
    return pipeline(spec, cal, mesh, PIPELINE_MICRO_BATCHES, PIPELINE_SCHEDULE, args.dtype, nics_per_node(args),
                    getattr(args, "profile_data", None))


def bench(args, cfg, model, pipe: Pipeline, world, backend) -> tuple[Bench, TrainStep]:
    """The pipeline's step on this rank, its numerics checked (NumericsError past the dtype's tolerance), and its
    Bench visited in cfg.rounds passes; the caller frees bench.runner.coll."""
    stack = CnnStack(model)
    data = stack.data(args.seed)
    p = len(pipe.stages)
    c = parse_config(f"t=1,p={p},d=1,mb={stack.batch // pipe.micro_batches},schedule={PIPELINE_SCHEDULE}")
    mesh, coord, _ = job_mesh(world, f"{p}x1x1")
    coll = Collectives(world, mesh, coord, backend)
    train = TrainStep(stack, data, c, Place(*coord, pipe.micro_batches), coll, backend.xp, args.dtype,
                      cut=pipe.stages)
    err = float(coll.world_max(train.errors(data, reference(stack, data))).max())
    if not err <= TOLERANCE[args.dtype]:
        coll.free()
        raise NumericsError(f"network {model.name} strategy {PIPELINE}: max relative error {err:.3g} of outputs and "
                            f"weight gradients > {TOLERANCE[args.dtype]:g} against the single-process reference")
    phase, run = train.phases()[0]
    out = Bench(Runner(mesh, coord, coll, backend.xp), Program((Item(phase, lambda env: run()),), {}, ()))
    out.max_rel_err = err
    rule = cfg.rule.visit(cfg.rounds)
    for _ in range(cfg.rounds):
        out.visit(rule)
    return out, train


def measured_comm(train: TrainStep, total_s: float, world) -> float:
    """The step less the busiest stage's passes: its messages and the bubble (predicted: bubble_s + messages_s)."""
    shares = np.stack(world.allgather(train.clock.shares()))
    return total_s * (1 - float(shares[:, 0].max()))
