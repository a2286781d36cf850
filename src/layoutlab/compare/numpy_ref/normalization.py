"""Float64 batch norm (batch or running statistics, and PyTorch's running update) and
group norm."""

from __future__ import annotations

from typing import Any

import numpy as np

from layoutlab.compare.numpy_ref.layouts import (
    channel_vector,
    f64,
    from_channels_first,
    per_channel,
    read_layout,
    to_channels_first,
)

__all__ = ["batch_norm", "batch_norm_running_update", "group_norm"]


def _stat_axes(ndim: int) -> tuple[int, ...]:
    return (0, *range(2, ndim))


def batch_norm(
    x: Any,
    scale: Any = None,
    bias: Any = None,
    *,
    mean: Any = None,
    var: Any = None,
    eps: float = 1e-5,
    layout: Any,
) -> np.ndarray:
    """``(x - mean) / sqrt(var + eps) * scale + bias`` per channel. Without ``mean``/``var``
    the batch statistics are used (biased variance), as in training mode."""
    x = f64(x)
    lay = read_layout(layout, x, "batch_norm")
    xc = to_channels_first(x, lay)
    c = xc.shape[1]
    if (mean is None) != (var is None):
        raise ValueError("batch_norm: give both mean and var, or neither for batch statistics.")
    if mean is None:
        m = xc.mean(axis=_stat_axes(xc.ndim))
        v = xc.var(axis=_stat_axes(xc.ndim))
    else:
        m = channel_vector(mean, c, 0.0, "batch_norm mean")
        v = channel_vector(var, c, 1.0, "batch_norm var")
    g = channel_vector(scale, c, 1.0, "batch_norm scale")
    b = channel_vector(bias, c, 0.0, "batch_norm bias")
    y = (xc - per_channel(m, xc.ndim)) / np.sqrt(per_channel(v, xc.ndim) + eps)
    y = y * per_channel(g, xc.ndim) + per_channel(b, xc.ndim)
    return from_channels_first(y, lay)


def batch_norm_running_update(
    running_mean: Any,
    running_var: Any,
    x: Any,
    momentum: float = 0.1,
    *,
    layout: Any,
    unbiased: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's running-statistics update: ``new = (1 - momentum) * old + momentum * batch``
    with the unbiased batch variance. (Flax's ``momentum`` is ``1 - `` this one, and Flax
    uses the biased variance: pass ``momentum=1 - flax_momentum, unbiased=False``.)"""
    x = f64(x)
    lay = read_layout(layout, x, "batch_norm_running_update")
    xc = to_channels_first(x, lay)
    c = xc.shape[1]
    count = xc.size // c
    if unbiased and count < 2:
        raise ValueError(
            "batch_norm_running_update: the unbiased variance needs more than one value per "
            f"channel, got input shape {x.shape}."
        )
    batch_mean = xc.mean(axis=_stat_axes(xc.ndim))
    batch_var = xc.var(axis=_stat_axes(xc.ndim), ddof=1 if unbiased else 0)
    rm = channel_vector(running_mean, c, 0.0, "running_mean")
    rv = channel_vector(running_var, c, 1.0, "running_var")
    return (1 - momentum) * rm + momentum * batch_mean, (1 - momentum) * rv + momentum * batch_var


def group_norm(
    x: Any,
    num_groups: int,
    scale: Any = None,
    bias: Any = None,
    eps: float = 1e-5,
    *,
    layout: Any,
) -> np.ndarray:
    """Group norm: statistics per example over each group of consecutive channels and all
    spatial positions (biased variance); then a per-channel affine."""
    x = f64(x)
    lay = read_layout(layout, x, "group_norm")
    xc = to_channels_first(x, lay)
    n, c = xc.shape[:2]
    if num_groups < 1 or c % num_groups:
        raise ValueError(f"group_norm: num_groups={num_groups} must divide channels ({c}).")
    xg = xc.reshape((n, num_groups, -1))
    mean = xg.mean(axis=2, keepdims=True)
    var = xg.var(axis=2, keepdims=True)
    y = ((xg - mean) / np.sqrt(var + eps)).reshape(xc.shape)
    g = channel_vector(scale, c, 1.0, "group_norm scale")
    b = channel_vector(bias, c, 0.0, "group_norm bias")
    y = y * per_channel(g, y.ndim) + per_channel(b, y.ndim)
    return from_channels_first(y, lay)
