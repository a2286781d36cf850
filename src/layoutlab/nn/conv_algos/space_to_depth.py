"""Stride-2 convs as stride-1 convs on a space-to-depth input.

The padded input's 2x2 pixel blocks become channels, ``(N, H, W, C) -> (N, H/2, W/2, 4C)``,
and the ``k x k`` kernel, zero-padded to an even size, becomes a ``ceil(k/2)`` square kernel
over ``4C`` channels. XLA then sees a stride-1 conv, whose input gradient stays on its fast
path instead of the ``lhs_dilation`` conv of a strided one; the price is the zero taps
(3x3: 16/9 of the multiplies, 7x7: 64/49). JAX differentiates it directly.
"""

from __future__ import annotations

import jax.numpy as jnp

from layoutlab.nn.conv_algos.algorithm import plain_2d
from layoutlab.nn.conv_algos.geometry import ConvSpec, Geometry
from layoutlab.nn.conv_algos.im2col import pad_input
from layoutlab.nn.conv_algos.native import native_conv

__all__ = ["space_to_depth_conv", "supports"]


def supports(spec: ConvSpec) -> str | None:
    reason = plain_2d(spec)
    if reason:
        return reason
    g = spec.geometry
    if g.strides != (2, 2):
        return f"strides {g.strides} (space-to-depth is for stride 2)"
    if g.kernel_size[0] < 2 or g.kernel_size[1] < 2:
        return f"kernel {g.kernel_size} (a 1x1 stride-2 conv is a strided slice: pointwise)"
    return None


def space_to_depth_conv(x, w, geom: Geometry, preferred):
    kh, kw = geom.kernel_size
    ho, wo = geom.out_size(x.shape[1:3])
    kh2, kw2 = -(-kh // 2), -(-kw // 2)
    # Rows needed: 2 * (ho + kh2 - 1); the padding's high side is cut or extended to that.
    need_h, need_w = 2 * (ho + kh2 - 1), 2 * (wo + kw2 - 1)
    (plh, _), (plw, _) = geom.padding
    h, w_ = x.shape[1:3]
    xp = pad_input(x, ((plh, need_h - h - plh), (plw, need_w - w_ - plw)))
    n, c = x.shape[0], x.shape[3]
    xs = xp.reshape(n, need_h // 2, 2, need_w // 2, 2, c)
    xs = jnp.transpose(xs, (0, 1, 3, 2, 4, 5)).reshape(n, need_h // 2, need_w // 2, 4 * c)
    o = w.shape[-1]
    wp = jnp.pad(w, ((0, 2 * kh2 - kh), (0, 2 * kw2 - kw), (0, 0), (0, 0)))
    ws = wp.reshape(kh2, 2, kw2, 2, c, o)
    ws = jnp.transpose(ws, (0, 2, 1, 3, 4, 5)).reshape(kh2, kw2, 4 * c, o)
    stride1 = Geometry((kh2, kw2), (1, 1), ((0, 0), (0, 0)), (1, 1), 1)
    return native_conv(xs, ws, stride1, preferred)
