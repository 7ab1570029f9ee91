"""The local math of the convolutional layers (analysis.conv), as analysis.kernels is for the others: kernels take the
array module and the environment of named buffers and write their outputs there. Tensors are NCHW, weights
[F, C, k, k]; a convolution is stride 1 with "same" zero padding, computed as im2col and one matrix product.

Spatial parallelism cuts H: a halo exchange (analysis.halo) puts the neighbours' boundary rows into the environment
as Xtop and Xbot, which stand in for the zero padding above and below the local block; absent (the whole-array
reference, or no spatial split), the padding is zeros. Each kernel is one pass the pricing sees as one step: the
im2col copy, a GEMM, the col2im additions. In the backward pass the gradients of those borrowed rows
come out as dXtop and dXbot, for the halo exchange to send back to their owners."""

from __future__ import annotations


def _padded(xp, e, k: int):
    """X padded by (k-1)/2 on every side, its rows above and below taken from Xtop and Xbot where present."""
    x, h = e["X"], (k - 1) // 2
    zeros = xp.zeros(x.shape[:2] + (h, x.shape[3]), dtype=x.dtype)
    rows = xp.concatenate([e.get("Xtop", zeros), x, e.get("Xbot", zeros)], axis=2)
    return xp.pad(rows, ((0, 0), (0, 0), (0, 0), (h, h)))


def _columns(xp, xp_pad, k: int, height: int, width: int):
    """im2col: [C*k*k, N*H*W], row c*k*k + i*k + j holding input channel c shifted by (i, j)."""
    n, c = xp_pad.shape[:2]
    shifted = xp.stack([xp_pad[:, :, i:i + height, j:j + width] for i in range(k) for j in range(k)], axis=2)
    return shifted.transpose(1, 2, 0, 3, 4).reshape(c * k * k, n * height * width)


def conv_columns(k: int, xp, e) -> None:
    """cols = im2col(X): the input (halo rows included) shifted k*k ways, stacked, then laid out as columns."""
    x = e["X"]
    e["cols"] = _columns(xp, _padded(xp, e, k), k, x.shape[2], x.shape[3])


def conv_product(xp, e) -> None:
    """Y = W @ cols, from [F, N*H*W] back to NCHW."""
    x, w = e["X"], e["W"]
    y = w.reshape(w.shape[0], -1) @ e["cols"]
    e["Y"] = xp.ascontiguousarray(y.reshape(w.shape[0], x.shape[0], *x.shape[2:]).transpose(1, 0, 2, 3))


def _grad_matrix(e):
    dy = e["dY"]
    return dy.transpose(1, 0, 2, 3).reshape(dy.shape[1], -1)


def conv_column_grad(xp, e) -> None:
    """dcols = W^T @ dY: the gradient of every column."""
    w = e["W"]
    e["dcols"] = w.reshape(w.shape[0], -1).T @ _grad_matrix(e)


def conv_input_grad(k: int, xp, e) -> None:
    """dX = col2im(dcols): each shifted copy's gradient added back in place; the gradients of the halo rows go to
    dXtop and dXbot."""
    x = e["X"]
    n, c, height, width = x.shape
    h = (k - 1) // 2
    dcols = e["dcols"].reshape(c, k * k, n, height, width)
    dpad = xp.zeros((n, c, height + 2 * h, width + 2 * h), dtype=x.dtype)
    for i in range(k):
        for j in range(k):
            dpad[:, :, i:i + height, j:j + width] += dcols[:, i * k + j].transpose(1, 0, 2, 3)
    e["dX"] = xp.ascontiguousarray(dpad[:, :, h:h + height, h:h + width])
    if "Xtop" in e:
        e["dXtop"] = xp.ascontiguousarray(dpad[:, :, :h, h:h + width])
        e["dXbot"] = xp.ascontiguousarray(dpad[:, :, h + height:, h:h + width])


def conv_weight_grad(xp, e) -> None:
    """dW = dY @ cols^T over the im2col columns of the forward pass."""
    w = e["W"]
    e["dW"] = (_grad_matrix(e) @ e["cols"].T).reshape(w.shape)


def _windows(x):
    """The four corners of every 2 x 2 window: (top-left, top-right, bottom-left, bottom-right) strided views."""
    return [x[:, :, i::2, j::2] for i in (0, 1) for j in (0, 1)]


def pool_forward(xp, e) -> None:
    """2 x 2 max pooling, stride 2."""
    a, b, c, d = _windows(e["X"])
    e["Y"] = xp.maximum(xp.maximum(a, b), xp.maximum(c, d))


def pool_grad(xp, e) -> None:
    """Each window's gradient to its maximum (the first corner that holds it, on a tie): the corners stacked, the
    arg-max of each window, the gradient routed to it and written back through the corners."""
    x, dy = e["X"], e["dY"]
    corners = xp.stack(_windows(x))
    routed = (xp.arange(4).reshape(4, 1, 1, 1, 1) == corners.argmax(axis=0)) * dy
    dx = xp.empty_like(x)
    for k, dst in enumerate(_windows(dx)):
        dst[...] = routed[k]
    e["dX"] = dx


def flatten_forward(xp, e) -> None:
    e["Y"] = e["X"].reshape(e["X"].shape[0], -1)


def flatten_grad(xp, e) -> None:
    e["dX"] = e["dY"].reshape(e["X"].shape)


def bn_stats(xp, e) -> None:
    """S = [sum X, sum X^2] per channel: a partial sum where the batch or the height is split."""
    x = e["X"]
    e["S"] = xp.stack([x.sum(axis=(0, 2, 3)), (x * x).sum(axis=(0, 2, 3))])


def _per_channel(v):
    return v[None, :, None, None]


def bn_forward(count: int, eps: float, xp, e) -> None:
    """Y = gamma (X - mean) / sqrt(var + eps) + beta, mean and var over the `count` elements of each channel (the
    global batch and image); W holds [gamma, beta]."""
    mean = e["S"][0] / count
    e["inv"] = 1 / xp.sqrt(e["S"][1] / count - mean * mean + eps)
    e["xhat"] = (e["X"] - _per_channel(mean)) * _per_channel(e["inv"])
    e["Y"] = _per_channel(e["W"][0]) * e["xhat"] + _per_channel(e["W"][1])


def bn_grad_stats(xp, e) -> None:
    """G = [sum dY, sum dY * xhat] per channel: beta's and gamma's gradients, partial where X is split."""
    dy = e["dY"]
    e["G"] = xp.stack([dy.sum(axis=(0, 2, 3)), (dy * e["xhat"]).sum(axis=(0, 2, 3))])


def bn_grad(count: int, xp, e) -> None:
    """dX from the reduced G; dW = [dgamma, dbeta] = [G[1], G[0]]."""
    g = e["G"]
    e["dX"] = _per_channel(e["W"][0] * e["inv"]) * (e["dY"] - _per_channel(g[0] / count)
                                                     - e["xhat"] * _per_channel(g[1] / count))
    e["dW"] = xp.stack([g[1], g[0]])
