"""The local math of each layer's computations (layers.Compute.kernel): what a layer's schedule computes, run by
the harness on every device's shards and, on the whole float64 arrays, as the reference. A kernel takes the array
module and the environment of named buffers (X, W, Y, dX, dW, dY, Q, K, V, A, ids) and writes its outputs there."""

from __future__ import annotations

import math

import numpy as np


def linear_forward(xp, e) -> None:
    e["Y"] = e["X"] @ e["W"]


def linear_input_grad(xp, e) -> None:
    e["dX"] = e["dY"] @ e["W"].T


def linear_weight_grad(xp, e) -> None:
    e["dW"] = e["X"].T @ e["dY"]


def block_product(out: str, a: str, b: str, ta: bool, tb: bool, accumulate: bool, xp, e) -> None:
    """e[out] = (or +=) e[a] @ e[b], either operand transposed: one step of a grid schedule (analysis.colossal)."""
    p = (e[a].T if ta else e[a]) @ (e[b].T if tb else e[b])
    e[out] = e[out] + p if accumulate else p


def activation_forward(op: str, xp, e) -> None:
    e["Y"] = ACTIVATIONS[op][0](xp, e["X"])


def activation_grad(op: str, xp, e) -> None:
    e["dX"] = e["dY"] * ACTIVATIONS[op][1](xp, e["X"])


def attention_forward_scores(seq: int, hd: int, xp, e) -> None:
    e.update(attention_scores(xp, e["X"], seq, hd))


def attention_forward_output(xp, e) -> None:
    e["Y"] = attention_output(xp, e)


def attention_grad_values(seq: int, hd: int, xp, e) -> None:
    e.update(attention_back_values(xp, e, seq, hd))


def attention_grad_inputs(hd: int, xp, e) -> None:
    e["dX"] = attention_back_inputs(xp, e, hd)


def embedding_lookup(xp, e) -> None:
    e["Y"] = e["W"][e["ids"]]


def embedding_grad(xp, e) -> None:
    """The dense table gradient: zeros with dY added into the rows looked up."""
    dw = xp.zeros(e["W"].shape, dtype=e["W"].dtype)
    scatter_add(xp, dw, e["ids"], e["dY"])
    e["dW"] = dw


def scatter_add(xp, dst, ids, rows) -> None:
    """dst[ids] += rows with repeated ids summed. On a GPU in float32, cupy's add.at (one kernel of atomic adds, as
    a training framework's embedding backward runs); elsewhere without numpy's element-at-a-time add.at loop: the
    k-th occurrences of the ids are distinct, so each occurrence level goes in with one plain indexed add (on a GPU
    that loop's kernels and reads back took 1.2-2.0 ms: docs/results.md, "One H100")."""
    if xp is not np and dst.dtype == np.float32:
        xp.add.at(dst, ids, rows)
        return
    order = xp.argsort(ids, kind="stable")
    ranked = ids[order]
    new = xp.ones(ranked.shape, dtype=bool)
    new[1:] = ranked[1:] != ranked[:-1]
    occurrence = xp.arange(ranked.size) - xp.flatnonzero(new)[xp.cumsum(new) - 1]
    for level in range(int(occurrence.max()) + 1 if ranked.size else 0):
        sel = order[occurrence == level]
        dst[ids[sel]] += rows[sel]


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


def layer_norm(xp, x, eps: float = 1e-5):
    """(x normalised over its last axis, 1 / its standard deviation): a layer norm without scale and shift."""
    centred = x - x.mean(axis=-1, keepdims=True)
    inv = 1 / xp.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps)
    return centred * inv, inv


def layer_norm_grad(xp, y, inv, dy):
    """The input gradient of layer_norm from its output y, its 1 / std and the output gradient dy."""
    return inv * (dy - dy.mean(axis=-1, keepdims=True) - y * (dy * y).mean(axis=-1, keepdims=True))
