"""im2col + GEMM: the conv as one matrix product over gathered patches.

Forward: ``Y[(n,h,w), o] = P[(n,h,w), (i,j,c)] @ W[(i,j,c), o]``, ``P`` built from
``kh * kw`` strided slices of the padded input. The gradients are GEMM-shaped too:
``dW = P^T @ dY`` (one GEMM, or one per kernel offset: ``weight_grad``), and ``dX`` is
``dY @ W^T`` scattered back (col2im) with ``lax.pad``, whose interior padding places
stride-``s`` rows without the ``lhs_dilation`` convolution XLA would otherwise use for a
strided conv's input gradient.

Half precision: operands stay in their dtype and the products accumulate in
``preferred_element_type`` (float32); the backward casts the cotangent to the operands'
dtype first, as autocast does.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from layoutlab.nn.conv_algos.geometry import Geometry

__all__ = [
    "col2im",
    "im2col_forward",
    "input_grad",
    "one_gemm_weight_grad",
    "pad_input",
    "patches",
    "per_offset_weight_grad",
    "rows_gemm_weight_grad",
    "weight_grad",
]


def pad_input(x, padding):
    """Zero-pad the spatial axes of an NHWC array; negative pads crop."""
    zero = jnp.zeros((), x.dtype)
    return lax.pad(x, zero, ((0, 0, 0), *((lo, hi, 0) for lo, hi in padding), (0, 0, 0)))


def patches(x, geom: Geometry, out_size):
    """``(N, Ho, Wo, kh * kw * C)`` windows of NHWC ``x``, ordered like a flattened HWIO."""
    xp = pad_input(x, geom.padding)
    (kh, kw), (sh, sw), (ho, wo) = geom.kernel_size, geom.strides, out_size
    cols = [
        lax.slice(
            xp,
            (0, i, j, 0),
            (xp.shape[0], i + (ho - 1) * sh + 1, j + (wo - 1) * sw + 1, xp.shape[3]),
            (1, sh, sw, 1),
        )
        for i in range(kh)
        for j in range(kw)
    ]
    return cols[0] if len(cols) == 1 else jnp.concatenate(cols, axis=-1)


def _matmul(a, b, preferred):
    """``a @ b`` contracting ``a``'s last and ``b``'s first axis."""
    return lax.dot_general(
        a, b, (((a.ndim - 1,), (0,)), ((), ())), preferred_element_type=preferred
    )


def im2col_forward(x, w, geom: Geometry, preferred):
    out = geom.out_size(x.shape[1:3])
    p = patches(x, geom, out)
    return _matmul(p, w.reshape(-1, w.shape[-1]), preferred)


def weight_grad(x, g, geom: Geometry, w_shape, preferred):
    """``dW = P^T dY``: for a 1x1 conv one GEMM on the input itself, else one GEMM while the
    patches ``P`` are no larger than ``dW`` (``N * Ho * Wo <= O``: small batches on small
    maps), else one GEMM per kernel offset.

    The single GEMM writes ``dW`` in place, while the per-offset GEMMs are stacked
    afterwards, a copy of the whole kernel gradient, which at batch 1 cost more than the
    GEMMs (docs/performance/measurements.md#conv-algorithms). Past that size the patches would be
    the larger copy.
    """
    if geom.kernel_size == (1, 1):
        return rows_gemm_weight_grad(x, g, geom, w_shape, preferred)
    if g.shape[0] * g.shape[1] * g.shape[2] <= w_shape[-1]:
        return one_gemm_weight_grad(x, g, geom, w_shape, preferred)
    return per_offset_weight_grad(x, g, geom, w_shape, preferred)


def rows_gemm_weight_grad(x, g, geom: Geometry, w_shape, preferred):
    """``dW = P^T dY`` contracting the patches ``P`` over their rows, without a
    channel-major copy. For a 1x1 conv ``P`` is the (strided) input itself, and the
    channel-major copy the other forms take was a slow transposing loop fused with the
    BatchNorm in front (ResNet-50 at batch 1: 72 of 470 thread-ms)."""
    p = patches(x, geom, g.shape[1:3])
    p2, g2 = p.reshape(-1, p.shape[-1]), g.reshape(-1, g.shape[-1])
    dw = lax.dot_general(p2, g2, (((0,), (0,)), ((), ())), preferred_element_type=preferred)
    return dw.reshape(w_shape)


def one_gemm_weight_grad(x, g, geom: Geometry, w_shape, preferred):
    """``dW = P^T dY``, with ``P^T`` (``kh * kw * C`` rows of ``N * Ho * Wo``) gathered from
    a channel-major copy of the input, so the GEMM reads both operands row-major and XLA:CPU
    hands it to YNNPACK (``P`` contracted over its rows went to Eigen's dot; the whole
    batch-1 step measured even: docs/performance/measurements.md#conv-algorithms)."""
    g2 = g.reshape(-1, g.shape[-1])
    return _matmul(
        _channel_major_slices(x, geom, g.shape[1:3], concat=True), g2, preferred
    ).reshape(w_shape)


def _channel_major_slices(x, geom: Geometry, out_size, concat: bool = False):
    """The ``kh * kw`` strided input slices each kernel offset sees, as ``(C, N*Ho*Wo)``
    row-major matrices taken from a channel-major copy of the input (the slices fuse into
    their consumers instead of materialising ``kh * kw`` copies of the input); ``concat``:
    stacked into one ``(kh * kw * C, N*Ho*Wo)`` matrix in HWIO's row order."""
    xt = jnp.transpose(pad_input(x, geom.padding), (3, 0, 1, 2))  # (C, N, Hp, Wp)
    (kh, kw), (sh, sw) = geom.kernel_size, geom.strides
    ho, wo = out_size
    c = xt.shape[0]
    parts = [
        lax.slice(
            xt,
            (0, 0, i, j),
            (c, xt.shape[1], i + (ho - 1) * sh + 1, j + (wo - 1) * sw + 1),
            (1, 1, sh, sw),
        ).reshape(c, -1)
        for i in range(kh)
        for j in range(kw)
    ]
    return jnp.concatenate(parts) if concat else parts


def per_offset_weight_grad(x, g, geom: Geometry, w_shape, preferred):
    """``dW[i, j] = X_ij^T dY``: one GEMM per kernel offset over all ``N * Ho * Wo``
    positions, stacked."""
    g2 = g.reshape(-1, g.shape[-1])
    parts = [_matmul(xs, g2, preferred) for xs in _channel_major_slices(x, geom, g.shape[1:3])]
    return jnp.stack(parts).reshape(w_shape)


def col2im(dp, geom: Geometry, in_size):
    """Sum the ``kh * kw`` patch gradients back onto the (unpadded) input positions."""
    (kh, kw), (sh, sw) = geom.kernel_size, geom.strides
    ho, wo = dp.shape[1:3]
    c = dp.shape[-1] // (kh * kw)
    zero = jnp.zeros((), dp.dtype)
    total = None
    for i in range(kh):
        for j in range(kw):
            k = i * kw + j
            part = dp[..., k * c : (k + 1) * c]
            # Patch row h came from padded row i + h * s, i.e. input row i + h * s - lo.
            lo_h, lo_w = i - geom.padding[0][0], j - geom.padding[1][0]
            hi_h = in_size[0] - (lo_h + (ho - 1) * sh + 1)
            hi_w = in_size[1] - (lo_w + (wo - 1) * sw + 1)
            placed = lax.pad(
                part, zero, ((0, 0, 0), (lo_h, hi_h, sh - 1), (lo_w, hi_w, sw - 1), (0, 0, 0))
            )
            total = placed if total is None else total + placed
    return total


def input_grad(g, w, geom: Geometry, in_size, preferred):
    """``dX = col2im(dY W^T)``."""
    w2 = w.reshape(-1, w.shape[-1])
    dp = lax.dot_general(g, w2, (((3,), (1,)), ((), ())), preferred_element_type=preferred)
    return col2im(dp, geom, in_size)
