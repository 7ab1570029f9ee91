"""Models as chains of layers, built from a spec "NAME[:key=value,...]": a preset or a free-form kind.

Kinds: linear (m, k, n), mlp (batch, d_in, d_hidden, d_out), dense (batch, dims=25088-4096-1000: linears
with an activation between), embedding (vocab, dim, tokens, density), transformer (d, heads, head_dim, seq,
batch, layers, ffn, vocab: 0 for no embedding, density), cnn (batch, image, channels, kernel, convs, dense, bn: a chain of
convolutions, each followed by a relu (bn=1: a batch norm before it), with "p" for a 2 x 2 max pooling, e.g. convs=16-16-p-32-32-p; then the
flattened dense head, e.g. dense=64-16; analysis.conv). A transformer block is QKV projection, per-head
attention, output projection, MLP (fc1, gelu, fc2); residuals and norms are elementwise and left out.
A cnn's residual additions (ResNet) are elementwise and left out the same way. Presets (overridable, e.g. "gpt-8.3b:layers=4"): see PRESETS."""

from __future__ import annotations

import math
from dataclasses import dataclass

from analysis.conv import Activation2d, BatchNorm2d, Conv2d, Flatten, Pool2d
from analysis.layers import Attention, Elementwise, Embedding, Layer, Linear
from microbench.errors import UsageError
from microbench.limits import MAX_BYTES
from microbench.ops import itemsize as dtype_itemsize

PRESETS = {
    # AutoDDL's transformer: model dim 8192, 64 heads x 128, 1024 sequences x 1024 tokens
    "autoddl-transformer": ("transformer", {"d": 8192, "heads": 64, "seq": 1024, "batch": 1024, "layers": 1}),
    # VGG13's three dense layers
    "vgg13": ("dense", {"batch": 256, "dims": "25088-4096-4096-1000"}),
    # Megatron-LM GPT configurations (hidden, heads, layers), sequence 1024, vocabulary 51200
    "gpt-1.2b": ("transformer", {"d": 1536, "heads": 16, "layers": 40, "seq": 1024, "batch": 512, "vocab": 51200}),
    "gpt-2.5b": ("transformer", {"d": 1920, "heads": 20, "layers": 54, "seq": 1024, "batch": 512, "vocab": 51200}),
    "gpt-4.2b": ("transformer", {"d": 2304, "heads": 24, "layers": 64, "seq": 1024, "batch": 512, "vocab": 51200}),
    "gpt-8.3b": ("transformer", {"d": 3072, "heads": 32, "layers": 72, "seq": 1024, "batch": 512, "vocab": 51200}),
    # GPT-3 (Brown et al. 2020) and the Megatron-LM 1T model (Narayanan et al. 2021), sequence 2048
    "gpt3-175b": ("transformer", {"d": 12288, "heads": 96, "layers": 96, "seq": 2048, "batch": 1536, "vocab": 51200}),
    "gpt-1t": ("transformer", {"d": 25600, "heads": 160, "layers": 128, "seq": 2048, "batch": 3072, "vocab": 51200}),
    # ParaDL's CNNs (Kahira et al. 2021: ResNet-50 and VGG16) at a size a 4-rank harness step runs in well under a
    # second: 32 x 32 images with 4 input channels (so channel parallelism splits the first layer too), batch 8
    "vgg-small": ("cnn", {"convs": "16-16-p-32-32-p", "dense": "64-16"}),
    "resnet-small": ("cnn", {"convs": "16-16-16-p-32-32-p", "dense": "16"}),
}

KINDS = {
    "linear": {"m": 1024, "k": 1024, "n": 1024},
    "mlp": {"batch": 1024, "d_in": 1024, "d_hidden": 4096, "d_out": 0},
    "dense": {"batch": 256, "dims": "1024-1024"},
    "embedding": {"vocab": 51200, "dim": 1024, "tokens": 8192, "density": 0.05},
    "transformer": {"d": 1024, "heads": 16, "head_dim": 0, "seq": 1024, "batch": 8, "layers": 1, "ffn": 0,
                    "vocab": 0, "density": 0.05},
    "cnn": {"batch": 8, "image": 32, "channels": 4, "kernel": 3, "convs": "16-16-p", "dense": "16", "bn": 0},
}
TEXT_PARAMS = ("dims", "convs", "dense")
ZERO_MEANS_DEFAULT = {"mlp": ("d_out",), "transformer": ("head_dim", "ffn", "vocab"), "cnn": ("bn",)}
"""The sizes of each kind that may be 0: none, or derived from the others (d_out = d_in, ffn = 4 d, no embedding)."""
MAX_DIM = 2 ** 40
"""The largest size a spec may give: far beyond any model, and small enough that products of sizes priced as floats
stay within what a double holds."""


@dataclass(frozen=True)
class Model:
    name: str
    layers: tuple[Layer, ...]


def _dense(prefix: str, batch: int, dims: list[int], isz: int) -> list[Layer]:
    out: list[Layer] = []
    for i, (a, b) in enumerate(zip(dims, dims[1:])):
        if i:
            out.append(Elementwise(f"{prefix}act{i}", isz, batch, a, "relu"))
        out.append(Linear(f"{prefix}fc{i + 1}", isz, batch, a, b))
    return out


def _transformer(p: dict, isz: int) -> list[Layer]:
    d, heads = p["d"], p["heads"]
    hd = p["head_dim"] or d // heads
    ffn = p["ffn"] or 4 * d
    tokens = p["batch"] * p["seq"]
    out: list[Layer] = []
    if p["vocab"]:
        out.append(Embedding("embed", isz, p["vocab"], d, tokens, float(p["density"])))
    for i in range(p["layers"]):
        out += [Linear(f"block{i}.qkv", isz, tokens, d, 3 * heads * hd),
                Attention(f"block{i}.attn", isz, p["batch"], p["seq"], heads, hd),
                Linear(f"block{i}.proj", isz, tokens, heads * hd, d),
                Linear(f"block{i}.fc1", isz, tokens, d, ffn),
                Elementwise(f"block{i}.gelu", isz, tokens, ffn),
                Linear(f"block{i}.fc2", isz, tokens, ffn, d)]
    return out


def _sizes(kind: str, key: str, text: str, allow: tuple[str, ...] = ()) -> list:
    """'16-16-p' -> [16, 16, 'p']: positive sizes joined by '-' (and the words in `allow`)."""
    try:
        out = [t if t in allow else int(t) for t in text.split("-")]
    except ValueError:
        raise UsageError(f"{kind}: {key}={text!r} must be sizes joined by '-'") from None
    if not out or any(isinstance(t, int) and not 1 <= t <= MAX_DIM for t in out):
        raise UsageError(f"{kind}: {key}={text!r} needs sizes 1 to {MAX_DIM}")
    return out


def _cnn(p: dict, isz: int) -> list[Layer]:
    """Convolutions (each with a relu) and poolings, flattened into the dense head (linears with a relu between)."""
    n, c, side, k = p["batch"], p["channels"], p["image"], p["kernel"]
    if k % 2 == 0:
        raise UsageError(f"cnn: kernel={k} must be odd ('same' padding)")
    out: list[Layer] = []
    convs = pools = 0
    for item in _sizes("cnn", "convs", p["convs"], ("p",)):
        if item == "p":
            if side % 2:
                raise UsageError(f"cnn: a {side} x {side} image cannot be pooled 2 x 2 (convs={p['convs']})")
            pools += 1
            out.append(Pool2d(f"pool{pools}", isz, n, c, side, side))
            side //= 2
            continue
        convs += 1
        out.append(Conv2d(f"conv{convs}", isz, n, c, item, side, side, k))
        if p["bn"]:
            out.append(BatchNorm2d(f"bn{convs}", isz, n, item, side, side))
        out.append(Activation2d(f"relu{convs}", isz, n, item, side, side))
        c = item
    out.append(Flatten("flatten", isz, n, c, side, side))
    return out + _dense("", n, [c * side * side, *_sizes("cnn", "dense", p["dense"])], isz)


def _params(kind: str, given: dict[str, str]) -> dict:
    out = dict(KINDS[kind])
    for key, text in given.items():
        if key not in out:
            raise UsageError(f"{kind} has no parameter {key!r}; it takes {', '.join(KINDS[kind])}")
        try:
            out[key] = text if key in TEXT_PARAMS else (float(text) if key == "density" else int(text))
        except ValueError:
            raise UsageError(f"{kind}: {key}={text!r} is not a number") from None
        if key == "density" and not 0 < out[key] <= 1:
            raise UsageError(f"{kind}: density must be in (0, 1] (got {out[key]})")
        if key in (*TEXT_PARAMS, "density"):
            continue
        least = 0 if key in ZERO_MEANS_DEFAULT.get(kind, ()) else 1
        if not least <= out[key] <= MAX_DIM:
            raise UsageError(f"{kind}: {key} must be {least} to {MAX_DIM} (got {out[key]})")
    return out


def _items(spec: str) -> tuple[str, list[tuple[str, str]]]:
    """The name and (key, value) items of "NAME[:key=value,...]", in order; an empty item is refused."""
    name, _, rest = spec.strip().partition(":")
    items = []
    for item in (t.strip() for t in rest.split(",")) if rest.strip() else ():
        if not item:
            raise UsageError(f"model spec {spec!r} has an empty item between commas")
        key, eq, val = item.partition("=")
        if not eq:
            raise UsageError(f"model spec {spec!r}: {item!r} is not key=value")
        items.append((key.strip(), val.strip()))
    return name, items


def check_spec(spec: str) -> str:
    """The spec as a user gave it, refused where it gives a key twice (parse_spec lets the later one override, which
    is how a chain's micro-batch is set on its spec, but from a user it is a typo that one value would hide)."""
    keys = [key for key, _ in _items(spec)[1]]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        raise UsageError(f"model spec {spec!r} gives {', '.join(twice)} more than once")
    return spec


def parse_spec(spec: str) -> tuple[str, dict]:
    """(kind, parameters) of "NAME[:key=value,...]", a preset's parameters overridden by those given (a later key by
    a later one)."""
    name, items = _items(spec)
    given = dict(items)
    if name in PRESETS:
        kind, base = PRESETS[name]
        given = {**{k: str(v) for k, v in base.items()}, **given}
    elif name in KINDS:
        kind = name
    else:
        raise UsageError(f"unknown model or layer {name!r}; choose from {', '.join([*PRESETS, *KINDS])}")
    p = _params(kind, given)
    if kind == "transformer" and p["d"] % p["heads"] and not p["head_dim"]:
        raise UsageError(f"transformer: d={p['d']} is not divisible by heads={p['heads']}")
    return kind, p


MAX_BLOCKS = 4096
"""The most transformer blocks a model spec may have: each is five layers the search prices one by one."""


def parse_model(spec: str, dtype: str = "float32") -> Model:
    """A Model from "NAME[:key=value,...]"."""
    kind, p = parse_spec(spec)
    isz = dtype_itemsize(dtype)
    if kind == "linear":
        layers: list[Layer] = [Linear("linear", isz, p["m"], p["k"], p["n"])]
    elif kind == "mlp":
        layers = _dense("", p["batch"], [p["d_in"], p["d_hidden"], p["d_out"] or p["d_in"]], isz)
    elif kind == "dense":
        dims = _sizes("dense", "dims", p["dims"])
        if len(dims) < 2:
            raise UsageError("dense: dims needs at least two positive sizes")
        layers = _dense("", p["batch"], dims, isz)
    elif kind == "cnn":
        layers = _cnn(p, isz)
    elif kind == "embedding":
        layers = [Embedding("embed", isz, p["vocab"], p["dim"], p["tokens"], p["density"])]
    else:
        if p["layers"] > MAX_BLOCKS:
            raise UsageError(f"transformer: layers={p['layers']}; commcal prices up to {MAX_BLOCKS} blocks")
        layers = _transformer(p, isz)
    _check_operands(spec, layers)
    return Model(spec, tuple(layers))


def _check_operands(spec: str, layers: list[Layer]) -> None:
    """Refuses a layer whose input, weight or gradient is over MAX_BYTES: beyond any machine, and where sizes priced
    as floats would no longer be whole bytes."""
    for layer in layers:
        for what, shape in layer.data_shapes().items():
            if math.prod(shape) * layer.itemsize > MAX_BYTES:
                raise UsageError(f"model spec {spec!r}: layer {layer.name}'s {what} of shape {shape} is over "
                                 f"{MAX_BYTES} bytes")
