"""Depthwise convs (one kernel per channel) as ``kh * kw`` shifted multiply-adds.

``y = sum_ij slice_ij(x) * w[i, j]``: strided slices of the padded input, each scaled by
one kernel tap per channel, which XLA fuses into one elementwise loop over the output. JAX
differentiates it directly: the input gradient is the taps' padded ``dy * w`` summed, the
weight gradient one reduction of ``slice_ij(x) * dy`` per tap. XLA:CPU's own grouped conv
is many times slower (docs/performance/measurements.md#conv-algorithms).

It reads and writes NHWC or NCHW as given (``layouts``): the taps broadcast over the
channel axis wherever it is, so a channels-first model pays no transpose for it.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from layoutlab.nn.conv_algos.geometry import ConvSpec, Geometry

__all__ = ["depthwise_conv", "supports"]


def supports(spec: ConvSpec) -> str | None:
    g = spec.geometry
    if g.groups == 1 or not g.groups == spec.in_features == spec.out_features:
        return (
            f"groups={g.groups} with {spec.in_features}->{spec.out_features} channels "
            "(depthwise is for one kernel per channel: groups == in == out channels)"
        )
    if g.dilation != (1, 1):
        return f"dilation={g.dilation} (dilated convs run natively)"
    return None


def depthwise_conv(x, w, geom: Geometry, preferred, layout: str = "NHWC"):
    """``x`` in ``layout``, ``w`` HWIO with one input channel; products and sums in
    ``preferred`` (the accumulation dtype; None: ``x``'s)."""
    acc = x.dtype if preferred is None else jnp.dtype(preferred)
    spatial, channel = ((1, 2), 3) if layout == "NHWC" else ((2, 3), 1)
    pads = [(0, 0, 0)] * 4
    for axis, (lo, hi) in zip(spatial, geom.padding, strict=True):
        pads[axis] = (lo, hi, 0)
    xp = lax.pad(x, jnp.zeros((), x.dtype), pads)
    out = geom.out_size(tuple(x.shape[a] for a in spatial))
    (kh, kw), strides = geom.kernel_size, geom.strides
    taps = w.reshape(kh, kw, -1).astype(acc)
    tap_shape = [1] * 4
    tap_shape[channel] = taps.shape[-1]
    step = [1] * 4
    for axis, s in zip(spatial, strides, strict=True):
        step[axis] = s
    y = None
    for i in range(kh):
        for j in range(kw):
            start, limit = [0] * 4, list(xp.shape)
            for axis, offset, n, s in zip(spatial, (i, j), out, strides, strict=True):
                start[axis], limit[axis] = offset, offset + (n - 1) * s + 1
            term = lax.slice(xp, start, limit, step).astype(acc) * taps[i, j].reshape(tap_shape)
            y = term if y is None else y + term
    return y


depthwise_conv.layouts = ("NHWC", "NCHW")
