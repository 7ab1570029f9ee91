"""Executes analysis' schedules on one device's local shards: each redistribute.Step by its documented
semantics through a Collectives adapter (analysis.harness_comm), each layers.Compute by its own kernel (analysis.kernels).
Array module `xp` is a parameter; nothing here imports MPI."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from analysis import colossal, kernels
from analysis.conv import BatchNorm2d, Conv2d
from analysis.halo import Halo
from analysis.layers import Compute, Embedding, Layer, Linear, Schedule
from analysis.mesh import Mesh
from analysis.redistribute import Step
from analysis.sbp import Signature, local_slices, partial_owner


def _split(xp, buf, dim: int, g: int):
    """buf cut into g blocks along dim, stacked in a new leading axis (contiguous)."""
    shape = buf.shape[:dim] + (g, buf.shape[dim] // g) + buf.shape[dim + 1:]
    return xp.ascontiguousarray(xp.moveaxis(buf.reshape(shape), dim, 0))


def _join(xp, blocks, dim: int):
    """Blocks stacked in a leading axis, concatenated along dim."""
    g = blocks.shape[0]
    if dim == 0:
        return blocks.reshape((g * blocks.shape[1],) + blocks.shape[2:])
    return xp.concatenate([blocks[i] for i in range(g)], axis=dim)


def run_step(step: Step, buf, coll, coord: tuple[int, ...], xp=np, check_bytes: bool = True):
    """The local buffer after `step` (redistribute's semantics); collectives go through `coll`. check_bytes:
    refuse a buffer of another size than the plan priced."""
    g, axis, op = step.group_size, step.axis, step.op
    if check_bytes and step.is_comm and buf.nbytes != step.bytes_per_rank:
        raise ValueError(f"{step.describe()}: buffer holds {buf.nbytes} B, the plan priced {step.bytes_per_rank} B")
    if op == "allreduce":
        return coll.allreduce(buf, axis)
    if op == "reduce_scatter":
        out = coll.reduce_scatter(_split(xp, buf, step.scatter_dim, g), axis)
        return out if step.scatter_dim == 0 else xp.ascontiguousarray(out)
    if op == "allgather":
        return _join(xp, coll.allgather(buf, axis), step.gather_dim)
    if op == "alltoall":
        return _join(xp, coll.alltoall(_split(xp, buf, step.scatter_dim, g), axis), step.gather_dim)
    if op == "slice":
        d = step.scatter_dim
        n = buf.shape[d] // g
        return xp.ascontiguousarray(buf[(slice(None),) * d + (slice(coord[axis] * n, (coord[axis] + 1) * n),)])
    if op == "relabel":
        return buf
    if op == "partial":
        if step.gather_dim is None:
            return buf if partial_owner(coord, axis) else xp.zeros_like(buf)
        d, n = step.gather_dim, buf.shape[step.gather_dim]
        out = xp.zeros(step.out_shape, dtype=buf.dtype)
        out[(slice(None),) * d + (slice(coord[axis] * n, (coord[axis] + 1) * n),)] = buf
        return out
    raise ValueError(f"cannot execute step {op!r}")


@dataclass(frozen=True)
class Item:
    """One timed unit: the schedule entry it executes and what it does to the environment of named buffers."""

    entry: Step | Halo | Compute
    run: Callable[[dict], None]

    @property
    def is_comm(self) -> bool:
        return self.entry.is_comm


@dataclass(frozen=True)
class Output:
    """A buffer to check: its env name, global reference (float64) and signature (P axes are summed first)."""

    name: str
    reference: np.ndarray
    sig: Signature


@dataclass(frozen=True)
class Program:
    items: tuple[Item, ...]
    inputs: dict
    outputs: tuple[Output, ...]


class Runner:
    """Builds Programs for one device: mesh coordinate, adapter, array module."""

    def __init__(self, mesh: Mesh, coord: tuple[int, ...], coll, xp=np):
        self.mesh, self.coord, self.coll, self.xp = mesh, coord, coll, xp
        self._last_reference: tuple | None = None     # (data, kernels, reference) of the last program built

    def shard(self, arr: np.ndarray, sig: Signature, dtype):
        """This device's block of a global array (P treated as B: inputs never carry partial sums)."""
        block = arr[local_slices(arr.shape, sig, self.mesh.shape, self.coord)]
        return self.xp.asarray(np.ascontiguousarray(block, dtype=dtype))

    def step(self, st: Step, src: str, dst: str) -> Item:
        def run(env):
            env[dst] = run_step(st, env[src], self.coll, self.coord, self.xp)
        return Item(st, run)

    def chain(self, steps, src: str, dst: str) -> list[Item]:
        """Items redistributing env[src] into env[dst] step by step."""
        return [self.step(st, src if i == 0 else dst, dst) for i, st in enumerate(steps)]

    def program(self, layer: Layer, sched: Schedule, data: dict, dtype) -> Program:
        """The items that run `sched` on this device, its inputs (data's shards where layer.data_sigs places them)
        and the outputs to check against the schedule's own kernels run on the whole float64 data."""
        dtype = np.dtype(dtype)
        s = sched.strategy
        if isinstance(sched, colossal.GridSchedule):
            return self._grid(layer, sched, data, dtype)
        inputs = {name: self.shard(data[name], sig, dtype) for name, sig in layer.data_sigs(s).items()}
        computes = [c for c in sched.steps if isinstance(c, Compute)]
        if isinstance(layer, Embedding):
            items, inputs["ids"], ids = self._embedding(layer, sched, data)
            reference = self._reference(layer, data, computes, ids)
        else:
            reference = self._reference(layer, data, computes)
            if isinstance(layer, Linear):
                items = self._linear(sched)
                inputs["Wst"] = inputs["W"]
            elif isinstance(layer, Conv2d):
                items = self._phases(sched, ("", "dW"))
            elif isinstance(layer, BatchNorm2d):
                items = self._phases(sched, ("S", "G"))
            else:
                items = self._computes(sched.steps)
        outputs = tuple(Output(name, reference[name], sig) for name, sig in layer.output_sigs(s).items()
                        if name in reference)
        if tuple(i.entry for i in items) != sched.steps:
            raise ValueError(f"{layer.name} {s.id}: the harness would not run the priced schedule in its order")
        return Program(tuple(items), inputs, outputs)

    def _reference(self, layer: Layer, data: dict, computes: list[Compute], ids=None) -> dict:
        """The whole float64 data (and an embedding's global `ids`) after `computes`' kernels. A layer's strategies
        mostly run the same kernels on the same data, so the last program's reference serves again rather than every
        rank recomputing it per strategy (on a large layer, seconds of float64 GEMMs each); an embedding's ids depend
        on the strategy, so its reference is always its own."""
        kernels = tuple((c.expr, c.kernel) for c in computes)
        last = self._last_reference
        if ids is None and last is not None and last[0] is data and last[1] == kernels:
            return last[2]
        reference = {name: data[name].astype(np.float64) for name in layer.data_shapes()}
        if ids is not None:
            reference["ids"] = ids
        for c in computes:
            c.run(np, reference)
        if ids is None:
            self._last_reference = (data, kernels, reference)
        return reference

    def _grid(self, layer: Linear, sched: colossal.GridSchedule, data: dict, dtype) -> Program:
        """A Colossal-AI schedule or its SBP equivalent (analysis.colossal): each entry on the buffers it names, the
        weight (W, also named Wst) sharded in the strategy's stored row order; checked against the plain product of
        the whole float64 arrays."""
        g, shape = sched.strategy, self.mesh.shape
        s, wsig = colossal.sigs(g), colossal.weight_sig(g)
        inputs = {"X": self.shard(data["X"], s.x, dtype), "dY": self.shard(data["dY"], s.dy, dtype),
                  "W": self.shard(colossal.stored_order(g, data["W"], shape), wsig, dtype)}
        inputs["Wst"] = inputs["W"]
        ref = {name: data[name].astype(np.float64) for name in ("X", "W", "dY")}
        for kernel in (kernels.linear_forward, kernels.linear_input_grad, kernels.linear_weight_grad):
            kernel(np, ref)
        outputs = [Output("Y", ref["Y"], s.y), Output("dW", colossal.stored_order(g, ref["dW"], shape), wsig)]
        if any(isinstance(e, Compute) and e.expr.startswith("dX") for e in sched.backward):
            outputs.append(Output("dX", ref["dX"], s.dx))
        items = []
        for entry, names in zip(sched.steps, sched.buffers):
            if isinstance(entry, Compute):
                items.append(Item(entry, partial(entry.run, self.xp)))
            elif isinstance(entry, colossal.Rooted):
                items.append(self.rooted(entry, *names))
            else:
                items.append(self.step(entry, *names))
        return Program(tuple(items), inputs, tuple(outputs))

    def rooted(self, entry: colossal.Rooted, src: str, dst: str) -> Item:
        """A bcast from (env[src] at the root, a fresh buffer elsewhere) into env[dst], or a reduce of env[src]
        into env[dst] at the root (the other members keep their env[dst])."""
        xp, mine = self.xp, self.coord[entry.axis] == entry.root

        def run(env):
            buf = env[src]
            if entry.op == "bcast":
                env[dst] = self.coll.bcast(buf if mine else xp.empty(entry.shape, dtype=buf.dtype), entry.axis,
                                           entry.root)
                return
            out = self.coll.reduce(buf, entry.axis, entry.root)
            if mine:
                env[dst] = out
        return Item(entry, run)

    def _computes(self, phase) -> list[Item]:
        xp = self.xp
        return [Item(c, partial(c.run, xp)) for c in phase]

    def _linear(self, sched) -> list[Item]:
        """Each phase: the stored weight gathered into W, the products, the weight gradient reduced into its
        stored placement."""
        items = []
        for phase in (sched.forward, sched.backward):
            first = next(i for i, it in enumerate(phase) if isinstance(it, Compute))
            last = max(i for i, it in enumerate(phase) if isinstance(it, Compute))
            items += self.chain(phase[:first], "Wst", "W")
            items += self._computes(phase[first:last + 1])
            items += self.chain(phase[last + 1:], "dW", "dW")
        return items

    def _phases(self, sched, buffers: tuple[str, str]) -> list[Item]:
        """A CNN layer's computations, halo exchanges (a convolution's, on X forward and dX backward) and
        redistribution steps, each phase's steps on its buffer: a convolution's weight gradient (backward), a batch
        norm's per-channel sums (both)."""
        items = []
        for phase, buf in zip((sched.forward, sched.backward), buffers):
            items += [Item(e, partial(e.run, self.xp)) if isinstance(e, Compute) else
                      Item(e, partial(e.run, coll=self.coll, xp=self.xp)) if isinstance(e, Halo) else
                      self.step(e, buf, buf) for e in phase]
        return items

    def _embedding(self, layer: Embedding, sched, data) -> tuple[list[Item], object, np.ndarray]:
        """(items, this device's local ids, the global ids). Lookups run at the table rows' owner; the forward
        all-to-alls bring them to the tokens' devices and the backward ones (in reverse order, the inverse
        permutation) carry the gradient rows back. Token ids are drawn so each lands on the device that looks it
        up, from a pool small enough for the sparse allgathers' priced row counts; sparse exchanges are padded to
        exactly the priced bytes."""
        xp, mesh, coll, s = self.xp, self.mesh, self.coll, sched.strategy
        g = layer.sigs(s)
        table = layer.table_sig(s)
        vd = (layer.vocab, layer.dim)
        a2a = [st for st in sched.forward if isinstance(st, Step)]
        exchanges = [st for st in sched.backward if isinstance(st, Step) and st.op != "alltoall"]
        rows_sl = local_slices(layer.out_shape, g.y, mesh.shape, self.coord)[0]
        pos = xp.arange(rows_sl.start, rows_sl.stop, dtype=xp.int64).reshape(-1, 1)
        for st in reversed(a2a):
            pos = run_step(st, pos, coll, self.coord, xp, check_bytes=False)
        lookup = np.asarray(_host(pos)).ravel()
        tslice = local_slices(vd, table, mesh.shape, self.coord)
        owners = coll.world_gather(np.stack([lookup, np.full_like(lookup, tslice[0].start)]))
        offset = np.full(layer.tokens, -1, dtype=np.int64)
        for where, start in owners:
            if ((offset[where] != -1) & (offset[where] != start)).any():
                raise ValueError(f"{layer.name} {s.id}: tokens looked up on two different table shards")
            offset[where] = start
        local_rows = tslice[0].stop - tslice[0].start
        pool = min([local_rows] + [st.in_shape[0] for st in exchanges if st.op == "allgather"])
        ids = offset + np.random.default_rng(data["seed"]).integers(0, pool, layer.tokens)
        lookup_c, scatter_c = (c for c in sched.steps if isinstance(c, Compute))
        items = [*self._computes([lookup_c]), *self.chain(a2a, "Y", "Y"), *self.chain(reversed(a2a), "dY", "dY"),
                 *self._computes([scatter_c])]
        for st in exchanges:
            items.append(self.step(st, "dW", "dW") if st.op == "allreduce" else self._sparse_gather(st))
        return items, xp.asarray(ids[lookup] - tslice[0].start), ids

    def _sparse_gather(self, st: Step) -> Item:
        """The first st.in_shape[0] rows of the dense gradient (every touched row lies there) with their int64
        indices, packed as bytes, allgathered, and summed back into those rows (Step.copies counts the traffic).
        One member's indices are distinct, so each member's rows go in with a plain indexed add, not the far
        slower unbuffered ufunc.at that repeated indices would need."""
        xp = self.xp
        rows = st.in_shape[0]

        def run(e):
            dw = e["dW"]
            vals = xp.ascontiguousarray(dw[:rows])
            packed = xp.concatenate([vals.view(xp.uint8).reshape(rows, -1),
                                     xp.arange(rows, dtype=xp.int64).view(xp.uint8).reshape(rows, 8)], axis=1)
            got = run_step(st, packed, self.coll, self.coord, xp)
            width = vals.nbytes // rows
            ids = xp.ascontiguousarray(got[:, width:]).view(xp.int64).ravel()
            incoming = xp.ascontiguousarray(got[:, :width]).view(dw.dtype)
            dw[:rows] = 0                       # this rank's own rows arrive in `got` with the others'
            for k in range(st.group_size):
                part = slice(k * rows, (k + 1) * rows)
                dw[ids[part]] += incoming[part]
        return Item(st, run)


def _host(arr):
    return arr.get() if hasattr(arr, "get") else arr


