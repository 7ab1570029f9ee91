"""A whole network on the harness: one Program that runs a chain of layers under an assignment of their strategies
(analysis.paradl's network strategies), forward through every layer and the redistributions between them, then
backward, in the order analysis.summary.chain_steps prices. Each layer's items come from Runner.program and run on
the layer's own names (`Scoped`); the outputs checked are every layer's output, input gradient and weight gradient
against a single-process float64 run of the whole chain. Nothing here imports MPI."""

from __future__ import annotations

import math
from collections.abc import MutableMapping
from dataclasses import replace

import numpy as np

from analysis.harness_exec import Item, Program, Runner
from analysis.layers import Compute, Embedding
from analysis.models import Model
from analysis.paradl import NetworkOptions
from analysis.search import resolved
from analysis.redistribute import plan
from analysis.summary import chain_steps
from microbench.errors import UsageError


class Scoped(MutableMapping):
    """Layer i's view of the program's environment: its name X is "i:X", except where `renames` says otherwise
    (its input where no step moves the previous layer's output, say)."""

    def __init__(self, env: dict, i: int, renames: dict[str, str]):
        self.env, self.prefix, self.renames = env, f"{i}:", renames

    def key(self, name: str) -> str:
        return self.renames.get(name, self.prefix + name)

    def __getitem__(self, name):
        return self.env[self.key(name)]

    def __setitem__(self, name, value):
        self.env[self.key(name)] = value

    def __delitem__(self, name):
        del self.env[self.key(name)]

    def __iter__(self):
        return (k[len(self.prefix):] for k in list(self.env) if k.startswith(self.prefix))

    def __len__(self):
        return sum(1 for _ in self)


def network_data(model: Model, seed: int) -> dict:
    """Seeded float64 inputs of a chain: the first layer's X, every layer's weight W (scaled by 1/sqrt(fan-in), so
    activations keep their size through the layers) and the last layer's output gradient dY."""
    if any(isinstance(layer, Embedding) for layer in model.layers):
        raise UsageError(f"model {model.name}: a network run takes no embedding layer")
    rng = np.random.default_rng(seed)
    first, last = model.layers[0], model.layers[-1]
    out = {"X": rng.standard_normal(first.in_shape), "dY": rng.standard_normal(last.out_shape), "seed": seed}
    for i, layer in enumerate(model.layers):
        shape = layer.data_shapes().get("W")
        if shape is not None:
            fan_in = shape[0] if len(shape) == 2 else math.prod(shape[1:])
            out[f"{i}:W"] = rng.standard_normal(shape) / math.sqrt(fan_in)
    return out


def _reference(model: Model, schedules, data: dict) -> list[dict]:
    """Each layer's global X, W and dY in a float64 run of the whole chain on one process."""
    envs, x = [], data["X"]
    for i, (layer, sched) in enumerate(zip(model.layers, schedules)):
        env = {"X": x, "seed": data["seed"]}
        if f"{i}:W" in data:
            env["W"] = data[f"{i}:W"]
        for c in sched.forward:
            if isinstance(c, Compute):
                c.run(np, env)
        envs.append(env)
        x = env["Y"]
    dy = data["dY"]
    for env, sched in zip(reversed(envs), reversed(schedules)):
        env["dY"] = dy
        for c in sched.backward:
            if isinstance(c, Compute):
                c.run(np, env)
        dy = env.get("dX")
    return [{k: env[k] for k in ("X", "W", "dY", "seed") if k in env} for env in envs]


def network_program(runner: Runner, opts: NetworkOptions, i: int, data: dict, dtype) -> Program:
    """The Program that runs network strategy i of `opts` on this device, from `data` (network_data)."""
    t, choice = opts.tables, opts.choices[i]
    layers = [o.layer for o in t.options]
    schedules = [o.schedules[c] for o, c in zip(t.options, choice)]
    per_layer = [runner.program(layer, sched, d, dtype)
                 for layer, sched, d in zip(layers, schedules, _reference(opts.model, schedules, data))]
    mesh, n = runner.mesh, len(layers)
    sigs = [o.layer.sigs(o.strategies[c]) for o, c in zip(t.options, choice)]
    env_inputs, renames, moves = {}, [{} for _ in layers], {}
    parts = dict(chain_steps(t, choice, permute=False))
    for k, layer in enumerate(layers):
        if k + 1 < n:
            nxt = layers[k + 1].name
            fwd, bwd = parts[f"{layer.name} -> {nxt}"], parts[f"{nxt} -> {layer.name} gradient"]
            moves[k] = (fwd, bwd)
            if not fwd:
                renames[k + 1]["X"] = f"{k}:Y"
            if not bwd:
                renames[k]["dY"] = f"{k + 1}:dX"
    for k, prog in enumerate(per_layer):
        for name, value in prog.inputs.items():
            if (name == "X" and k > 0) or (name == "dY" and k + 1 < n):
                continue                     # produced by the chain as it runs
            env_inputs[f"{k}:{name}"] = value
    shape, isz = layers[-1].out_shape, layers[-1].itemsize
    out_plan = plan(shape, isz, sigs[-1].y, resolved(sigs[-1].y), mesh).steps
    grad_plan = plan(shape, isz, resolved(sigs[-1].y), sigs[-1].dy, mesh).steps
    if grad_plan:                            # the output gradient arrives where the resolved output lies
        del env_inputs[f"{n - 1}:dY"]
        env_inputs["out:dY"] = runner.shard(data["dY"], resolved(sigs[-1].y), dtype)
    items: list[Item] = []
    for k, prog in enumerate(per_layer):
        items += [_scoped(it, k, renames[k]) for it in prog.items[:len(schedules[k].forward)]]
        if k + 1 < n and moves[k][0]:
            items += runner.chain(moves[k][0], f"{k}:Y", f"{k + 1}:X")
    items += runner.chain(out_plan, f"{n - 1}:Y", "out:Y")
    if grad_plan:
        items += runner.chain(grad_plan, "out:dY", f"{n - 1}:dY")
    for k in reversed(range(n)):
        if k + 1 < n and moves[k][1]:
            items += runner.chain(moves[k][1], f"{k + 1}:dX", f"{k}:dY")
        items += [_scoped(it, k, renames[k]) for it in per_layer[k].items[len(schedules[k].forward):]]
    entries = tuple(it.entry for it in items)
    if entries != tuple(opts.steps(i)):
        raise ValueError(f"{opts.model.name} {opts.strategies[i].id}: the harness would not run the priced chain in "
                         f"its order")
    outputs = tuple(replace(o, name=f"{k}:{o.name}") for k, prog in enumerate(per_layer) for o in prog.outputs)
    return Program(tuple(items), env_inputs, outputs)


def _scoped(item: Item, k: int, renames: dict[str, str]) -> Item:
    return Item(item.entry, lambda env, run=item.run: run(Scoped(env, k, renames)))
