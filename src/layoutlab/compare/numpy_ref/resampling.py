"""Float64 nearest and (bi/tri)linear up-sampling with PyTorch's ``F.interpolate`` rules."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from layoutlab.compare.numpy_ref.layouts import (
    f64,
    from_channels_first,
    read_layout,
    to_channels_first,
)

__all__ = ["upsample_nearest", "upsample_bilinear"]


def _scales(scale: float | Sequence[float], ns: int) -> tuple[float, ...]:
    if isinstance(scale, int | float | np.integer | np.floating):
        scales = (float(scale),) * ns
    else:
        scales = tuple(float(v) for v in scale)
    if len(scales) != ns or any(v <= 0 for v in scales):
        raise ValueError(f"scale needs 1 or {ns} positive values, got {scale}.")
    return scales


def upsample_nearest(x: Any, scale: float | Sequence[float], layout: Any) -> np.ndarray:
    """PyTorch ``F.interpolate(mode="nearest", scale_factor=scale)``: output size
    ``floor(n * scale)``, source index ``min(floor(i / scale), n - 1)``."""
    x = f64(x)
    lay = read_layout(layout, x, "upsample_nearest")
    xc = to_channels_first(x, lay)
    for axis, sc in enumerate(_scales(scale, lay.num_spatial), start=2):
        n = xc.shape[axis]
        out = math.floor(n * sc)
        src = np.minimum(np.floor(np.arange(out) * (1.0 / sc)).astype(int), n - 1)
        xc = np.take(xc, src, axis=axis)
    return from_channels_first(xc, lay)


def _linear_axis(x: np.ndarray, axis: int, scale: float, align_corners: bool) -> np.ndarray:
    n = x.shape[axis]
    out = math.floor(n * scale)
    dst = np.arange(out, dtype=np.float64)
    if align_corners:
        src = dst * ((n - 1) / (out - 1) if out > 1 else 0.0)
    else:
        src = np.maximum((dst + 0.5) * (1.0 / scale) - 0.5, 0.0)
    i0 = np.minimum(np.floor(src).astype(int), n - 1)
    i1 = np.minimum(i0 + 1, n - 1)
    w1 = src - i0
    shape = [1] * x.ndim
    shape[axis] = out
    w1 = w1.reshape(shape)
    return np.take(x, i0, axis=axis) * (1.0 - w1) + np.take(x, i1, axis=axis) * w1


def upsample_bilinear(
    x: Any, scale: float | Sequence[float], align_corners: bool = False, *, layout: Any
) -> np.ndarray:
    """PyTorch ``F.interpolate`` linear interpolation (``linear``/``bilinear``/``trilinear``
    for 1D/2D/3D), applied one spatial axis at a time since it is separable."""
    x = f64(x)
    lay = read_layout(layout, x, "upsample_bilinear")
    xc = to_channels_first(x, lay)
    for axis, sc in enumerate(_scales(scale, lay.num_spatial), start=2):
        xc = _linear_axis(xc, axis, sc, align_corners)
    return from_channels_first(xc, lay)
