"""Executes analysis' schedules on one device's local shards: each redistribute.Step by its documented
semantics through a Collectives adapter (analysis.harness_comm), each layers.Compute by the layer's math.
Array module `xp` is a parameter; nothing here imports MPI."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from analysis.layers import Attention, Compute, Elementwise, Embedding, Layer, Linear, Schedule
from analysis.mesh import Mesh
from analysis.redistribute import Step
from analysis.sbp import B, Signature, Split, local_slices, partial_owner


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

    entry: Step | Compute
    run: Callable[[dict], None]

    @property
    def is_comm(self) -> bool:
        return isinstance(self.entry, Step) and self.entry.is_comm


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
        kind = {Linear: self._linear, Elementwise: self._elementwise, Attention: self._attention,
                Embedding: self._embedding}[type(layer)]
        prog = kind(layer, sched, data, np.dtype(dtype))
        if tuple(i.entry for i in prog.items) != sched.steps:
            raise ValueError(f"{layer.name} {sched.strategy.id}: the harness would not run the priced schedule in "
                             f"its order")
        return prog

    def _computes(self, phase, fns: dict) -> list[Item]:
        out = []
        for c in phase:
            if c.expr not in fns:
                raise ValueError(f"the harness cannot execute {c.expr!r}")
            out.append(Item(c, fns[c.expr]))
        return out

    def _linear(self, layer: Linear, sched, data, dtype) -> Program:
        g = layer.sigs(sched.strategy)
        _, stored, _ = layer.weight_sigs(sched.strategy)
        fns = {"Y = X @ W": lambda e: e.__setitem__("Y", e["X"] @ e["W"]),
               "dX = dY @ W.T": lambda e: e.__setitem__("dX", e["dY"] @ e["W"].T),
               "dW = X.T @ dY": lambda e: e.__setitem__("dW", e["X"].T @ e["dY"])}
        items = []
        for phase in (sched.forward, sched.backward):
            first = next(i for i, it in enumerate(phase) if isinstance(it, Compute))
            last = max(i for i, it in enumerate(phase) if isinstance(it, Compute))
            items += self.chain(phase[:first], "Wst", "W")
            items += self._computes(phase[first:last + 1], fns)
            items += self.chain(phase[last + 1:], "dW", "dW")
        w = self.shard(data["W"], stored, dtype)
        inputs = {"X": self.shard(data["X"], g.x, dtype), "Wst": w, "W": w, "dY": self.shard(data["dY"], g.dy, dtype)}
        x, wt, dy = (data[k].astype(np.float64) for k in ("X", "W", "dY"))
        outputs = (Output("Y", x @ wt, g.y), Output("dX", dy @ wt.T, g.dx), Output("dW", x.T @ dy, stored))
        has_dx = any(getattr(c, "expr", "") == "dX = dY @ W.T" for c in sched.backward)
        return Program(tuple(items), inputs, outputs if has_dx else outputs[:1] + outputs[2:])

    def _elementwise(self, layer: Elementwise, sched, data, dtype) -> Program:
        f, df = ACTIVATIONS[layer.op]
        xp = self.xp
        fns = {f"Y = {layer.op}(X)": lambda e: e.__setitem__("Y", f(xp, e["X"])),
               f"dX = dY * {layer.op}'(X)": lambda e: e.__setitem__("dX", e["dY"] * df(xp, e["X"]))}
        g = layer.sigs(sched.strategy)
        items = self._computes(sched.steps, fns)
        inputs = {"X": self.shard(data["X"], g.x, dtype), "dY": self.shard(data["dY"], g.dy, dtype)}
        x, dy = data["X"].astype(np.float64), data["dY"].astype(np.float64)
        outputs = (Output("Y", f(np, x), g.y),) + ((Output("dX", dy * df(np, x), g.dx),) if sched.backward else ())
        return Program(tuple(items), inputs, outputs)

    def _attention(self, layer: Attention, sched, data, dtype) -> Program:
        xp, seq, hd = self.xp, layer.seq, layer.head_dim
        fns = {"A = softmax(Q @ K.T)": lambda e: e.update(attention_scores(xp, e["X"], seq, hd)),
               "Y = A @ V": lambda e: e.__setitem__("Y", attention_output(xp, e)),
               "dA = dY @ V.T; dV = A.T @ dY": lambda e: e.update(attention_back_values(xp, e, seq, hd)),
               "dQ = dS @ K; dK = dS.T @ Q": lambda e: e.__setitem__("dX", attention_back_inputs(xp, e, hd))}
        g = layer.sigs(sched.strategy)
        items = self._computes(sched.steps, fns)
        inputs = {"X": self.shard(data["X"], g.x, dtype), "dY": self.shard(data["dY"], g.dy, dtype)}
        ref = {"X": data["X"].astype(np.float64), "dY": data["dY"].astype(np.float64)}
        ref.update(attention_scores(np, ref["X"], seq, hd))
        ref["Y"] = attention_output(np, ref)
        ref.update(attention_back_values(np, ref, seq, hd))
        ref["dX"] = attention_back_inputs(np, ref, hd)
        outputs = (Output("Y", ref["Y"], g.y),) + ((Output("dX", ref["dX"], g.dx),) if sched.backward else ())
        return Program(tuple(items), inputs, outputs)

    def _embedding(self, layer: Embedding, sched, data, dtype) -> Program:
        """Lookups run at the table rows' owner; the forward all-to-alls bring them to the tokens' devices and
        the backward ones (in reverse order, the inverse permutation) carry the gradient rows back. Token ids
        are drawn so each lands on the device that looks it up, from a pool small enough for the sparse
        allgathers' priced row counts; sparse exchanges are padded to exactly the priced bytes."""
        xp, mesh, coll, s = self.xp, self.mesh, self.coll, sched.strategy
        g = layer.sigs(s)
        table = tuple(_TABLE[c] for c in s.choices)
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
        my_ids = xp.asarray(ids[lookup] - tslice[0].start)

        def lookup_rows(e):
            e["Y"] = e["W"][my_ids]

        def scatter(e):
            dw = xp.zeros(e["W"].shape, dtype=e["W"].dtype)
            scatter_add(xp, dw, my_ids, e["dY"])
            e["dW"] = dw

        compute = {c.expr: c for c in sched.steps if isinstance(c, Compute)}
        items = [Item(compute["Y = W[ids]"], lookup_rows), *self.chain(a2a, "Y", "Y"),
                 *self.chain(reversed(a2a), "dY", "dY"), Item(compute["dW[ids] += dY"], scatter)]
        for st in exchanges:
            items.append(self.step(st, "dW", "dW") if st.op == "allreduce" else self._sparse_gather(st))
        w = data["W"]
        dw = np.zeros(vd)
        np.add.at(dw, ids, data["dY"].astype(np.float64))
        inputs = {"W": self.shard(w, table, dtype), "dY": self.shard(data["dY"], g.dy, dtype)}
        return Program(tuple(items), inputs, (Output("Y", w.astype(np.float64)[ids], g.y), Output("dW", dw, table)))

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


_TABLE = {"dar": B, "dag": B, "r": Split(0), "c": Split(1), "-": B}
"""Embedding: the table's placement on an axis per strategy choice (layers.Embedding._schedule)."""


def scatter_add(xp, dst, ids, rows) -> None:
    """dst[ids] += rows with repeated ids summed, as ufunc.at does but 3-4x faster: the k-th occurrences of
    the ids are distinct, so each occurrence level goes in with one plain indexed add."""
    order = xp.argsort(ids, kind="stable")
    ranked = ids[order]
    new = xp.ones(ranked.shape, dtype=bool)
    new[1:] = ranked[1:] != ranked[:-1]
    occurrence = xp.arange(ranked.size) - xp.flatnonzero(new)[xp.cumsum(new) - 1]
    for level in range(int(occurrence.max()) + 1 if ranked.size else 0):
        sel = order[occurrence == level]
        dst[ids[sel]] += rows[sel]


def _host(arr):
    return arr.get() if hasattr(arr, "get") else arr


def _gelu(xp, x):
    return 0.5 * x * (1 + xp.tanh(_C * (x + 0.044715 * x ** 3)))


def _gelu_grad(xp, x):
    t = xp.tanh(_C * (x + 0.044715 * x ** 3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _C * (1 + 3 * 0.044715 * x * x)


_C = math.sqrt(2 / math.pi)
ACTIVATIONS = {"gelu": (_gelu, _gelu_grad),
               "relu": (lambda xp, x: xp.maximum(x, 0), lambda xp, x: (x > 0).astype(x.dtype))}


def _heads(x, seq: int, hd: int, parts: int):
    """[seqs*seq, heads*parts*hd] -> [seqs*heads, seq, parts, hd]."""
    seqs, heads = x.shape[0] // seq, x.shape[1] // (parts * hd)
    return x.reshape(seqs, seq, heads, parts, hd).transpose(0, 2, 1, 3, 4).reshape(seqs * heads, seq, parts, hd)


def _tokens(h, seq: int, rows: int):
    """[seqs*heads, seq, parts, hd] -> [seqs*seq, heads*parts*hd]."""
    bh, _, parts, hd = h.shape
    seqs = rows // seq
    return h.reshape(seqs, bh // seqs, seq, parts, hd).transpose(0, 2, 1, 3, 4).reshape(rows, -1)


def attention_scores(xp, x, seq: int, hd: int) -> dict:
    qkv = _heads(x, seq, hd, 3)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    s = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
    a = xp.exp(s - s.max(axis=-1, keepdims=True))
    return {"Q": q, "K": k, "V": v, "A": a / a.sum(axis=-1, keepdims=True)}


def attention_output(xp, e):
    return _tokens((e["A"] @ e["V"])[:, :, None, :], e["V"].shape[1], e["X"].shape[0])


def attention_back_values(xp, e, seq: int, hd: int) -> dict:
    dy = _heads(e["dY"], seq, hd, 1)[:, :, 0]
    return {"dA": dy @ e["V"].transpose(0, 2, 1), "dV": e["A"].transpose(0, 2, 1) @ dy}


def attention_back_inputs(xp, e, hd: int):
    a = e["A"]
    ds = a * (e["dA"] - (e["dA"] * a).sum(axis=-1, keepdims=True)) / math.sqrt(hd)
    dq, dk = ds @ e["K"], ds.transpose(0, 2, 1) @ e["Q"]
    return _tokens(xp.stack([dq, dk, e["dV"]], axis=2), e["V"].shape[1], e["X"].shape[0])
