"""`commcal profile --model SPEC [--layer SPEC] --mesh M [--mesh M2] --out PROFILE.json` (under mpirun/srun): time
every local kernel the strategies of those networks and layers run on those meshes, at their local shapes, with all
ranks computing at once, and write a compute profile (analysis.kernel_profile) that `search`, `predict` and `validate`
take with --profile to price those kernels by their measured time instead of the calibration's roofline. For a network:
its layers in order under each of ParaDL's strategies that apply on the mesh, the layers of its pipeline (one
micro-batch, replicated) and each layer under every SBP strategy on its own (only the ParaDL strategies --strategies
names, where given); for a layer: its SBP strategies on the mesh. --backend mpi-cuda or nccl runs the kernels on the
GPU, as validate does with that backend."""

from __future__ import annotations

import argparse
from dataclasses import replace

from analysis.conv import BatchNorm2d
from analysis.harness_cnn import ONE
from analysis.layers import Embedding, Strategy
from analysis.mesh import parse_mesh
from analysis.models import check_spec, parse_model
from analysis.paradl import PIPELINE, PIPELINE_MICRO_BATCHES, STRATEGIES, applicable, assignment, micro_batch_model
from analysis.options import add_dtype_argument
from microbench.buffers import ALLOCATORS, PAGE_POLICIES
from microbench.errors import UsageError
from microbench.flags import BACKEND_HELP, add_backend_argument

MAX_SAMPLES = 100_000
"""Timed calls per kernel at most: beyond, a profile of a few kernels would run for hours."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", action="append", default=[], metavar="SPEC",
                   help="a network (repeatable), e.g. vgg-small: its layers under ParaDL's strategies on each mesh and "
                        "its pipeline's micro-batch layers")
    p.add_argument("--layer", action="append", default=[], metavar="SPEC",
                   help="a layer or model spec (repeatable), e.g. linear:m=256,k=1024,n=1024: its SBP strategies on "
                        "each mesh")
    p.add_argument("--mesh", action="append", default=[], required=True,
                   help="a mesh the strategies run on (repeatable), e.g. 4 or 2x2: it sets the local shapes")
    p.add_argument("--strategies", default=None, metavar="LIST",
                   help="for --model, only these of ParaDL's network strategies, comma-separated, e.g. data,pipeline "
                        "(default: every one that applies on the mesh, the pipeline, and every SBP strategy of each "
                        "layer, which `search` prices beside them)")
    p.add_argument("--out", required=True, help="the profile file to write (JSON)")
    add_dtype_argument(p)
    add_backend_argument(p, BACKEND_HELP + " (the device the kernels run on: profile with validate's backend)")
    p.add_argument("--samples", type=int, default=15, help="timed calls of each kernel per program (default 15)")
    p.add_argument("--allocator", choices=ALLOCATORS, default="cache",
                   help="host memory as validate's --allocator (default cache)")
    p.add_argument("--page-policy", choices=PAGE_POLICIES, default="nohugepage",
                   help="huge-page advice for the kernels' arrays (default nohugepage, the sweep's default)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data")


def _names(text: str | None) -> tuple[list[str] | None, bool]:
    """(the ParaDL network strategies --strategies names, None for all that apply; whether the pipeline too)."""
    if text is None:
        return None, True
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if n != PIPELINE and n not in STRATEGIES:
            raise UsageError(f"--strategies: {n!r} is not a ParaDL strategy ({', '.join([*STRATEGIES, PIPELINE])})")
    return [n for n in names if n != PIPELINE], PIPELINE in names


def work(args) -> list[tuple[str, list[tuple[object, object, object]]]]:
    """(label, [(layer, feasible schedule, mesh), ...]) of every pass to profile: a network strategy's layers in order
    (so that each kernel meets the caches a whole pass leaves it), a pipeline stage's micro-batch layers, or one layer
    strategy; bad input is one UsageError line."""
    if not args.model and not args.layer:
        raise UsageError("give at least one --model SPEC or --layer SPEC")
    if not 2 <= args.samples <= MAX_SAMPLES:
        raise UsageError(f"--samples must be 2 to {MAX_SAMPLES}, not {args.samples}")
    if not 0 <= args.seed < 2 ** 63:
        raise UsageError(f"--seed must be 0 to 2^63 - 1, not {args.seed}")
    meshes = [parse_mesh(text) for text in args.mesh]
    names, pipe = _names(args.strategies)
    out: dict[tuple, tuple[str, list]] = {}

    def add(label, layers, strategies, mesh):
        scheds = [(layer, layer.schedule(st, mesh, i > 0 or len(layers) == 1), mesh)
                  for i, (layer, st) in enumerate(zip(layers, strategies))]
        key = tuple((replace(layer, name=""), sc.strategy, mesh.shape) for layer, sc, _ in scheds)
        if key not in out and all(sc.feasible for _, sc, _ in scheds):
            out[key] = (label, scheds)

    for spec in args.model:
        model = parse_model(check_spec(spec), args.dtype)
        if any(isinstance(layer, Embedding) for layer in model.layers):
            raise UsageError(f"--model {spec}: a network run takes no embedding layer")
        for mesh in meshes:
            for name in applicable(mesh) if names is None else [n for n in names if n in applicable(mesh)]:
                add(f"{spec} {name}", model.layers, assignment(model, name, mesh), mesh)
            if names is None:
                for layer in model.layers:
                    for st in layer.strategies(mesh):
                        add(f"{spec} {layer.name} {st.id}", [layer], [st], mesh)
        norm = any(isinstance(layer, BatchNorm2d) for layer in model.layers)
        if pipe and norm and names is not None:
            raise UsageError(f"--model {spec}: the pipeline runs no batch norm (its statistics would span a "
                             f"micro-batch, not the batch)")
        if pipe and not norm:
            layers = micro_batch_model(spec, PIPELINE_MICRO_BATCHES, args.dtype).layers
            add(f"{spec} {PIPELINE}", layers, [Strategy(("-",))] * len(layers), ONE)
    for spec in args.layer:
        for layer in parse_model(check_spec(spec), args.dtype).layers:
            if isinstance(layer, Embedding):
                raise UsageError(f"--layer {spec}: an embedding's kernels are not profiled (its lookups depend on the "
                                 f"ids each device holds)")
            for mesh in meshes:
                for st in layer.strategies(mesh):
                    add(f"{spec} {st.id}", [layer], [st], mesh)
    if not out:
        raise UsageError("nothing to profile: no feasible strategy of those specs on those meshes")
    return list(out.values())


def run(args: argparse.Namespace) -> int:
    todo = work(args)
    from analysis import kernel_profile_run

    return kernel_profile_run.main(args, todo, args.dtype)
