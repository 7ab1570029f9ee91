"""Convolutional layers on NCHW tensors (ParaDL's CNN layers) and their strategies, one choice per mesh axis:

  Conv2d        Y[N,F,H,W] = W[F,C,k,k] * X[N,C,H,W], stride 1, "same" padding; choices n (data: batch split,
                weight gradient allreduced), f (filter: output channels split, W's rows; the output is gathered
                by the next layer's plan and the input gradient is a partial sum), c (channel: input channels
                split; the output is a partial sum, reduced by the next layer's plan), s (spatial: H split, with
                a halo exchange of (k-1)/2 rows each way forward and backward, weight gradient allreduced), -.
                At most one mesh axis may take s: the halo runs along one axis's group.
  Pool2d        2 x 2 max pooling, stride 2; choices n, c (channels), s (H; local blocks must stay even), -.
  Activation2d  an elementwise activation (relu) on NCHW; choices n, c, s, -.
  BatchNorm2d   batch normalisation with the batch's statistics; choices n, c, s, -: under n and s the per-channel
                sums are allreduced, forward and backward.
  Flatten       [N,C,H,W] -> [N, C*H*W] for the dense head (analysis.layers.Linear); choices n, c (a block of
                channels is a block of the flattened columns), -.

Signatures follow layers' SBP rules: a conv is a matmul contracting C (and the kernel window), so f is Linear's
n and c is Linear's k; n and s split dims the weight does not touch, whose gradient is then a partial sum."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

from analysis import conv_kernels
from analysis.halo import Halo
from analysis.layers import (OPTIMIZER_STATES, Compute, Elementwise, Layer, Schedule, Sigs, Strategy, _Infeasible,
                             _per_axis)
from analysis.sbp import B, P, Split

ACTIVATION = {"n": Split(0), "c": Split(1), "s": Split(2), "-": B}
"""The placement of an NCHW activation under each choice of the map-like layers (pooling, activation)."""


@dataclass(frozen=True)
class _Map4d(Layer):
    """A layer that maps each NCHW element (or window) on its own: every tensor placed alike (ACTIVATION)."""

    batch: int = 1
    channels: int = 1
    height: int = 1
    width: int = 1

    CHOICES = ("n", "c", "s", "-")

    @property
    def in_shape(self):
        return (self.batch, self.channels, self.height, self.width)

    def sigs(self, s: Strategy) -> Sigs:
        sig = _per_axis(s.choices, ACTIVATION)
        return Sigs(sig, sig, sig, sig)


@dataclass(frozen=True)
class Activation2d(_Map4d):
    op: str = "relu"

    @property
    def out_shape(self):
        return self.in_shape

    _schedule = Elementwise._schedule          # the same local map, on an NCHW block


@dataclass(frozen=True)
class Pool2d(_Map4d):
    @property
    def out_shape(self):
        return (self.batch, self.channels, self.height // 2, self.width // 2)

    def _schedule(self, s, mesh, need_dx):
        if self.height % 2 or self.width % 2:
            raise _Infeasible(f"{self.name}: 2 x 2 pooling needs an even height and width ({self.height}x{self.width})")
        xl = self._local(self.in_shape, self.sigs(s).x, mesh)
        if xl[2] % 2:
            raise _Infeasible(f"{self.name}: a block of {xl[2]} rows cannot be pooled 2 x 2")
        yl = (*xl[:2], xl[2] // 2, xl[3] // 2)
        fwd = (Compute("Y = maxpool(X)", (xl,), yl, 0.0, conv_kernels.pool_forward),)
        # the corners stacked and read for their arg-max, the routed gradient written and read back, dY read
        bwd = (Compute("dX = unpool(dY)", (xl, xl, xl, xl, yl), xl, 0.0, conv_kernels.pool_grad),) if need_dx else ()
        return Schedule(s, fwd, bwd, self.itemsize * (math.prod(xl) + 2 * math.prod(yl)))


@dataclass(frozen=True)
class BatchNorm2d(_Map4d):
    """Batch normalisation with the batch's statistics (training), weights W = [gamma, beta] per channel. Where the
    batch or the height is split (n, s) the per-channel sums are partial: allreduced forward (sum and sum of
    squares) and backward (sum of dY and of dY * xhat, which are also beta's and gamma's gradients, so those need
    no exchange of their own): 2 C floats each way. Split channels (c) are independent."""

    eps: float = 1e-5

    @property
    def out_shape(self):
        return self.in_shape

    def stats_sigs(self, s: Strategy):
        """(the per-channel sums as computed, as used): partial where n or s splits X, split with the channels."""
        local = _per_axis(s.choices, {"n": P, "c": Split(1), "s": P, "-": B})
        return local, tuple(B if p == P else p for p in local)

    def weight_sig(self, s: Strategy):
        return _per_axis(s.choices, {"n": B, "c": Split(1), "s": B, "-": B})

    def data_shapes(self):
        return {"X": self.in_shape, "W": (2, self.channels), "dY": self.out_shape}

    def data_sigs(self, s):
        return {**super().data_sigs(s), "W": self.weight_sig(s)}

    def output_sigs(self, s):
        return {**super().output_sigs(s), "dW": self.weight_sig(s)}

    def _schedule(self, s, mesh, need_dx):
        xl = self._local(self.in_shape, self.sigs(s).x, mesh)
        partial_sig, whole = self.stats_sigs(s)
        sl = self._local((2, self.channels), whole, mesh)
        reduce = self._redistribute((2, self.channels), partial_sig, whole, mesh)
        count = self.batch * self.height * self.width
        fwd = (Compute("S = [sum X, sum X^2]", (xl, xl), sl, 0.0, conv_kernels.bn_stats), *reduce,
               Compute("Y = gamma * xhat + beta", (xl, xl, xl), xl, 0.0,
                       partial(conv_kernels.bn_forward, count, self.eps)))
        bwd = (Compute("G = [sum dY, sum dY * xhat]", (xl, xl), sl, 0.0, conv_kernels.bn_grad_stats), *reduce,
               Compute("dX = BN'(dY); dW = G", (xl, xl, xl), xl, 0.0, partial(conv_kernels.bn_grad, count)))
        return Schedule(s, fwd, bwd, self.itemsize * 4 * math.prod(xl))


@dataclass(frozen=True)
class Flatten(_Map4d):
    CHOICES = ("n", "c", "-")

    @property
    def out_shape(self):
        return (self.batch, self.channels * self.height * self.width)

    def sigs(self, s: Strategy) -> Sigs:
        x = _per_axis(s.choices, ACTIVATION)
        y = _per_axis(s.choices, {"n": Split(0), "c": Split(1), "-": B})
        return Sigs(x, y, y, x)

    def _schedule(self, s, mesh, need_dx):
        xl = self._local(self.in_shape, self.sigs(s).x, mesh)
        yl = (xl[0], math.prod(xl[1:]))
        fwd = (Compute("Y = X.reshape(N, -1)", (), (), 0.0, conv_kernels.flatten_forward),)
        bwd = (Compute("dX = dY.reshape(X.shape)", (), (), 0.0, conv_kernels.flatten_grad),) if need_dx else ()
        return Schedule(s, fwd, bwd, self.itemsize * (math.prod(xl) + math.prod(yl)))


@dataclass(frozen=True)
class Conv2d(Layer):
    batch: int = 1
    channels: int = 1
    filters: int = 1
    height: int = 1
    width: int = 1
    kernel: int = 3

    CHOICES = ("n", "f", "c", "s", "-")

    @property
    def in_shape(self):
        return (self.batch, self.channels, self.height, self.width)

    @property
    def out_shape(self):
        return (self.batch, self.filters, self.height, self.width)

    @property
    def weight_shape(self):
        return (self.filters, self.channels, self.kernel, self.kernel)

    def sigs(self, s: Strategy) -> Sigs:
        return Sigs(_per_axis(s.choices, {"n": Split(0), "f": B, "c": Split(1), "s": Split(2), "-": B}),
                    _per_axis(s.choices, {"n": Split(0), "f": Split(1), "c": P, "s": Split(2), "-": B}),
                    _per_axis(s.choices, {"n": Split(0), "f": Split(1), "c": B, "s": Split(2), "-": B}),
                    _per_axis(s.choices, {"n": Split(0), "f": P, "c": Split(1), "s": Split(2), "-": B}))

    def weight_sigs(self, s: Strategy):
        """(where the weight lies and is used, where its gradient is produced)."""
        return (_per_axis(s.choices, {"n": B, "f": Split(0), "c": Split(1), "s": B, "-": B}),
                _per_axis(s.choices, {"n": P, "f": Split(0), "c": Split(1), "s": P, "-": B}))

    def data_shapes(self):
        return {"X": self.in_shape, "W": self.weight_shape, "dY": self.out_shape}

    def data_sigs(self, s):
        return {**super().data_sigs(s), "W": self.weight_sigs(s)[0]}

    def output_sigs(self, s):
        return {**super().output_sigs(s), "dW": self.weight_sigs(s)[0]}

    def strategies(self, mesh):
        """Every choice per axis but s on more than one axis (the halo runs along one axis's group)."""
        return [st for st in super().strategies(mesh) if st.choices.count("s") <= 1]

    def check(self, strategy, mesh):
        super().check(strategy, mesh)
        if self.kernel % 2 == 0:
            raise _Infeasible(f"{self.name}: 'same' padding needs an odd kernel (got {self.kernel})")
        if strategy.choices.count("s") > 1:
            raise _Infeasible(f"{self.name}: spatial parallelism (s) on more than one mesh axis")

    def _halos(self, s, mesh, xl, grad: bool) -> tuple[Halo, ...]:
        rows = (self.kernel - 1) // 2
        out = []
        for axis, c in enumerate(s.choices):
            grp = mesh.axes[axis]
            if c != "s" or grp.size == 1 or not rows:
                continue
            if xl[2] < rows:
                raise _Infeasible(f"{self.name}: a block of {xl[2]} rows is thinner than the {rows}-row halo")
            slab = (xl[0], xl[1], rows, xl[3])
            out += [Halo(axis, 2, rows, d, grad, grp.size, grp.link, slab, self.itemsize) for d in (1, -1)]
        return tuple(out)

    def _schedule(self, s, mesh, need_dx):
        g = self.sigs(s)
        used, dw = self.weight_sigs(s)
        xl, yl = self._local(self.in_shape, g.x, mesh), self._local(self.out_shape, g.y, mesh)
        wl = self._local(self.weight_shape, used, mesh)
        k = self.kernel
        cols = (wl[1] * k * k, xl[0] * xl[2] * xl[3])
        shifted = (k * k,) + xl                   # the input shifted k*k ways: stacked, then transposed into cols
        flops = 2.0 * math.prod(cols) * wl[0]
        fwd = self._halos(s, mesh, xl, False) + (
            Compute("cols = im2col(X)", (xl, shifted, shifted), cols, 0.0, partial(conv_kernels.conv_columns, k)),
            Compute("Y = W @ cols", (cols, wl, yl), yl, flops, conv_kernels.conv_product))
        bwd = ()
        if need_dx:
            bwd = (Compute("dcols = W.T @ dY", (yl, wl), cols, flops, conv_kernels.conv_column_grad),
                   Compute("dX = col2im(dcols)", (shifted, shifted), shifted, 0.0,
                           partial(conv_kernels.conv_input_grad, k)),
                   *self._halos(s, mesh, xl, True))
        bwd += (Compute("dW = dY @ cols.T", (yl, cols), wl, flops, conv_kernels.conv_weight_grad),)
        bwd += self._redistribute(self.weight_shape, dw, used, mesh)
        mem = self.itemsize * ((2 + OPTIMIZER_STATES) * math.prod(wl) + math.prod(xl) + math.prod(yl)
                               + math.prod(cols))
        return Schedule(s, fwd, bwd, mem)
