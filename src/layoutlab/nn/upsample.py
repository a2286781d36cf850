"""Nearest and bilinear upsampling by an integer factor, with ``F.interpolate`` semantics."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from layoutlab.layout import Layout
from layoutlab.nn.base import LayoutModule
from layoutlab.nn.padding import normalize_tuple
from layoutlab.nn.pooling import apply_separable
from layoutlab.precision import Policy

__all__ = ["Upsample", "linear_interp_matrix"]


def linear_interp_matrix(size: int, out: int, align_corners: bool) -> np.ndarray:
    """``(out, size)`` weights of 1-D linear interpolation as ``F.interpolate`` computes it."""
    m = np.zeros((out, size), np.float64)
    for i in range(out):
        if align_corners:
            src = i * (size - 1) / (out - 1) if out > 1 else 0.0
        else:
            src = max((i + 0.5) * size / out - 0.5, 0.0)
        lo = min(int(np.floor(src)), size - 1)
        hi = min(lo + 1, size - 1)
        frac = src - lo
        m[i, lo] += 1.0 - frac
        m[i, hi] += frac
    return m.astype(np.float32)


class Upsample(LayoutModule):
    """Scale the spatial dims by integer factors; ``method`` is nearest or (bi/tri)linear."""

    def __init__(
        self,
        scale_factor: int | tuple[int, ...] = 2,
        *,
        method: str = "nearest",
        align_corners: bool = False,
        layout: Layout = Layout.NHWC,
        policy: Policy | None = None,
    ):
        self._set_layout_policy(layout, policy)
        if method not in ("nearest", "bilinear", "linear", "trilinear"):
            raise ValueError(f"Unknown upsampling method {method!r}; use 'nearest' or 'bilinear'.")
        self.scale_factor = normalize_tuple(scale_factor, self.layout.num_spatial, "scale_factor")
        self.method = "nearest" if method == "nearest" else "linear"
        self.align_corners = align_corners

    def __call__(self, x: jax.Array) -> jax.Array:
        self.layout.check_input(x.shape, None, "Upsample")
        if self.method == "nearest":
            for axis, s in zip(self.layout.spatial_axes, self.scale_factor, strict=True):
                x = jnp.repeat(x, s, axis=axis)
            return x
        sizes = self.layout.spatial_shape(x.shape)
        mats = [
            linear_interp_matrix(n, n * s, self.align_corners)
            for n, s in zip(sizes, self.scale_factor, strict=True)
        ]
        # The interpolation weights are exact in float32; the sum runs in float32 too.
        y = apply_separable(x, self.layout, mats, jnp.float32)
        return y.astype(self.policy.compute_dtype)
