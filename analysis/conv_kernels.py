"""The local math of the convolutional layers (analysis.conv), as analysis.kernels is for the others: kernels take the
array module and the environment of named buffers and write their outputs there. Tensors are NCHW, weights
[F, C, k, k]; a convolution is stride 1 with "same" zero padding, computed as im2col and one matrix product.

Spatial parallelism cuts H: a halo exchange (analysis.halo) puts the neighbours' boundary rows into the environment
as Xtop and Xbot, which stand in for the zero padding above and below the local block; absent (the whole-array
reference, or no spatial split), the padding is zeros. In the backward pass the gradients of those borrowed rows
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


def conv_forward(k: int, xp, e) -> None:
    """Y = W * X; the im2col columns stay in the environment for the weight gradient."""
    x, w = e["X"], e["W"]
    n, _, height, width = x.shape
    cols = _columns(xp, _padded(xp, e, k), k, height, width)
    e["cols"] = cols
    y = w.reshape(w.shape[0], -1) @ cols
    e["Y"] = xp.ascontiguousarray(y.reshape(w.shape[0], n, height, width).transpose(1, 0, 2, 3))


def _grad_matrix(e):
    dy = e["dY"]
    return dy.transpose(1, 0, 2, 3).reshape(dy.shape[1], -1)


def conv_input_grad(k: int, xp, e) -> None:
    """dX = W^T * dY (col2im of W^T dY); the gradients of halo rows go to dXtop and dXbot."""
    w, x = e["W"], e["X"]
    n, c, height, width = x.shape
    h = (k - 1) // 2
    dcols = (w.reshape(w.shape[0], -1).T @ _grad_matrix(e)).reshape(c, k * k, n, height, width)
    dpad = xp.zeros((n, c, height + 2 * h, width + 2 * h), dtype=x.dtype)
    for i in range(k):
        for j in range(k):
            dpad[:, :, i:i + height, j:j + width] += dcols[:, i * k + j].transpose(1, 0, 2, 3)
    e["dX"] = xp.ascontiguousarray(dpad[:, :, h:h + height, h:h + width])
    if "Xtop" in e:
        e["dXtop"] = xp.ascontiguousarray(dpad[:, :, :h, h:h + width])
        e["dXbot"] = xp.ascontiguousarray(dpad[:, :, h + height:, h:h + width])


def conv_weight_grad(xp, e) -> None:
    """dW = dY X^T over the im2col columns of the forward pass."""
    w = e["W"]
    e["dW"] = (_grad_matrix(e) @ e["cols"].T).reshape(w.shape)


def pool_forward(xp, e) -> None:
    """2 x 2 max pooling, stride 2; the arg-max of each window stays in the environment for the backward pass."""
    x = e["X"]
    n, c, height, width = x.shape
    win = x.reshape(n, c, height // 2, 2, width // 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(n, c, height // 2,
                                                                                           width // 2, 4)
    e["argmax"] = win.argmax(axis=-1)
    e["Y"] = xp.ascontiguousarray(win.max(axis=-1))


def pool_grad(xp, e) -> None:
    """Each window's gradient to its maximum."""
    x, dy, arg = e["X"], e["dY"], e["argmax"]
    n, c, height, width = x.shape
    win = (xp.arange(4) == arg[..., None]) * dy[..., None]
    e["dX"] = xp.ascontiguousarray(win.reshape(n, c, height // 2, width // 2, 2, 2).transpose(0, 1, 2, 4, 3, 5)
                                   .reshape(x.shape)).astype(x.dtype, copy=False)


def flatten_forward(xp, e) -> None:
    e["Y"] = e["X"].reshape(e["X"].shape[0], -1)


def flatten_grad(xp, e) -> None:
    e["dX"] = e["dY"].reshape(e["X"].shape)
