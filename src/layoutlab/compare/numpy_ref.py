"""Independent float64 NumPy reference implementations of the ops layoutlab's models use.

Only NumPy: no jax, no lax, and not even ``layoutlab.layout``, so a bug there cannot hide in
both the op and its reference. Every result is float64. Ops are computed in channels-first
order (N, C, spatial...) with plain loops over kernel offsets and einsum; channels-last inputs
are transposed in and out. Kernels come in the layout's kernel order: spatial..., in, out
(``HWIO``) for channels-last layouts, out, in, spatial... (``OIHW``) for channels-first ones.
Meant for tiny shapes in tests, not for speed. These refs are cross-checked against PyTorch
in ``tests/test_numpy_ref.py``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "conv",
    "conv_transpose",
    "same_padding",
    "max_pool",
    "avg_pool",
    "adaptive_avg_pool",
    "global_avg_pool",
    "batch_norm",
    "batch_norm_running_update",
    "group_norm",
    "upsample_nearest",
    "upsample_bilinear",
    "dense",
    "flatten",
    "relu",
    "softmax_cross_entropy",
]

_LAYOUTS = ("NWC", "NCW", "NHWC", "NCHW", "NDHWC", "NCDHW")

Padding = str | int | Sequence[int] | Sequence[tuple[int, int]]


class _Layout(NamedTuple):
    name: str
    channels_last: bool
    num_spatial: int


def _layout(layout: Any, x: np.ndarray, where: str) -> _Layout:
    name = str(getattr(layout, "value", layout)).upper()
    if name not in _LAYOUTS:
        raise ValueError(f"{where}: unknown layout {layout!r}; valid layouts are {_LAYOUTS}.")
    if x.ndim != len(name):
        raise ValueError(
            f"{where}: layout {name} needs a rank-{len(name)} input, got shape {x.shape}."
        )
    return _Layout(name, name.endswith("C"), len(name) - 2)


def _f64(x: Any) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def _to_cf(x: np.ndarray, lay: _Layout) -> np.ndarray:
    return np.moveaxis(x, -1, 1) if lay.channels_last else x


def _from_cf(x: np.ndarray, lay: _Layout) -> np.ndarray:
    return np.moveaxis(x, 1, -1) if lay.channels_last else x


def _tuple(value: int | Sequence[int], n: int, what: str) -> tuple[int, ...]:
    if isinstance(value, int | np.integer):
        return (int(value),) * n
    value = tuple(int(v) for v in value)
    if len(value) != n:
        raise ValueError(f"{what} needs 1 or {n} values, got {value}.")
    return value


def _channel_vector(v: Any, c: int, default: float, what: str) -> np.ndarray:
    if v is None:
        return np.full((c,), default)
    v = _f64(v)
    if v.shape != (c,):
        raise ValueError(f"{what} must have shape ({c},), got {v.shape}.")
    return v


def _per_channel(v: np.ndarray, ndim: int) -> np.ndarray:
    """Shape a (C,) vector to broadcast over a channels-first (N, C, spatial...) array."""
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def same_padding(size: int, kernel: int, stride: int = 1, dilation: int = 1) -> tuple[int, int]:
    """TF/XLA ``SAME`` padding: the output has ``ceil(size / stride)`` positions."""
    extent = (kernel - 1) * dilation + 1
    total = max((math.ceil(size / stride) - 1) * stride + extent - size, 0)
    return total // 2, total - total // 2


def _pads(
    padding: Padding,
    sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilation: Sequence[int],
) -> list[tuple[int, int]]:
    n = len(sizes)
    if isinstance(padding, str):
        mode = padding.upper()
        if mode == "SAME":
            return [
                same_padding(*args) for args in zip(sizes, kernel, strides, dilation, strict=True)
            ]
        if mode == "VALID":
            return [(0, 0)] * n
        raise ValueError(f"padding string must be 'SAME' or 'VALID', got {padding!r}.")
    if isinstance(padding, int | np.integer):
        pads = [(int(padding), int(padding))] * n
    else:
        items = list(padding)
        if len(items) != n:
            raise ValueError(f"padding needs {n} entries (one per spatial dim), got {padding}.")
        pads = [
            (int(p), int(p)) if isinstance(p, int | np.integer) else (int(p[0]), int(p[1]))
            for p in items
        ]
    if any(lo < 0 or hi < 0 for lo, hi in pads):
        raise ValueError(f"padding must be >= 0, got {pads}.")
    return pads


def _out_size(size: int, extent: int, stride: int, where: str) -> int:
    out = (size - extent) // stride + 1
    if size < extent or out <= 0:
        raise ValueError(
            f"{where}: the window (extent {extent}) is larger than the padded input ({size})."
        )
    return out


def _windows(
    xp: np.ndarray, kernel: Sequence[int], strides: Sequence[int], dilation: Sequence[int]
) -> np.ndarray:
    """im2col: (N, C, *spatial) padded -> (N, C, *kernel, *out) window values."""
    spatial = xp.shape[2:]
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilation, strict=True)]
    out = [_out_size(n, e, s, "window") for n, e, s in zip(spatial, extents, strides, strict=True)]
    patches = np.empty(xp.shape[:2] + tuple(kernel) + tuple(out), dtype=xp.dtype)
    for offset in itertools.product(*(range(k) for k in kernel)):
        window = tuple(
            slice(i * d, i * d + (o - 1) * s + 1, s)
            for i, d, o, s in zip(offset, dilation, out, strides, strict=True)
        )
        patches[(slice(None), slice(None), *offset)] = xp[(slice(None), slice(None), *window)]
    return patches


def _pad(x: np.ndarray, pads: Sequence[tuple[int, int]], value: float) -> np.ndarray:
    return np.pad(x, [(0, 0), (0, 0), *pads], constant_values=value)


_SPATIAL = "xyz"
_OUT = "uvw"


def conv(
    x: Any,
    kernel: Any,
    bias: Any = None,
    *,
    strides: int | Sequence[int] = 1,
    padding: Padding = "SAME",
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    layout: Any,
) -> np.ndarray:
    """N-d convolution (cross-correlation, like XLA and PyTorch) with groups; depthwise is
    ``groups == in_channels``. ``padding``: ``"SAME"`` (TF/XLA rule), ``"VALID"``, an int, or
    one int or ``(lo, hi)`` pair per spatial dim."""
    x = _f64(x)
    lay = _layout(layout, x, "conv")
    ns = lay.num_spatial
    k = _f64(kernel)
    if k.ndim != ns + 2:
        raise ValueError(f"conv: {lay.name} needs a rank-{ns + 2} kernel, got shape {k.shape}.")
    if lay.channels_last:
        k = np.moveaxis(k, (-1, -2), (0, 1))  # (*K, I, O) -> (O, I, *K)
    xc = _to_cf(x, lay)
    n, c = xc.shape[:2]
    o, i_per_group = k.shape[:2]
    if groups < 1 or c % groups or o % groups:
        raise ValueError(
            f"conv: groups={groups} must divide both in channels ({c}) and out channels ({o})."
        )
    if i_per_group != c // groups:
        raise ValueError(
            f"conv: kernel has {i_per_group} input channels per group, but the input has {c} "
            f"channels in {groups} group(s) ({c // groups} per group)."
        )
    ksize = k.shape[2:]
    strides_t = _tuple(strides, ns, "strides")
    dil = _tuple(dilation, ns, "dilation")
    pads = _pads(padding, xc.shape[2:], ksize, strides_t, dil)
    patches = _windows(_pad(xc, pads, 0.0), ksize, strides_t, dil)
    patches = patches.reshape((n, groups, c // groups) + patches.shape[2:])
    kg = k.reshape((groups, o // groups) + k.shape[1:])
    ks, os_ = _SPATIAL[:ns], _OUT[:ns]
    y = np.einsum(f"ngc{ks}{os_},goc{ks}->ngo{os_}", patches, kg, optimize=True)
    y = y.reshape((n, o) + y.shape[3:])
    if bias is not None:
        y = y + _per_channel(_channel_vector(bias, o, 0.0, "conv bias"), y.ndim)
    return _from_cf(y, lay)


def conv_transpose(
    x: Any,
    kernel: Any,
    bias: Any = None,
    *,
    strides: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    output_padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    layout: Any,
) -> np.ndarray:
    """PyTorch ``ConvTranspose`` semantics. The kernel is ``(in, out // groups, *K)``
    (``IOHW``) for channels-first layouts and ``(*K, in, out // groups)`` (``HWIO``) for
    channels-last ones, ``in`` being the input channels. Output size per dim:
    ``(n - 1) * s - 2 * p + d * (k - 1) + output_padding + 1``."""
    x = _f64(x)
    lay = _layout(layout, x, "conv_transpose")
    ns = lay.num_spatial
    k = _f64(kernel)
    if k.ndim != ns + 2:
        raise ValueError(
            f"conv_transpose: {lay.name} needs a rank-{ns + 2} kernel, got shape {k.shape}."
        )
    if lay.channels_last:
        k = np.moveaxis(k, (-2, -1), (0, 1))  # (*K, I, O/g) -> (I, O/g, *K)
    xc = _to_cf(x, lay)
    n, c = xc.shape[:2]
    if groups < 1 or c % groups:
        raise ValueError(f"conv_transpose: groups={groups} must divide in channels ({c}).")
    if k.shape[0] != c:
        raise ValueError(
            f"conv_transpose: kernel has {k.shape[0]} input channels, the input has {c}."
        )
    o_per_group = k.shape[1]
    ksize = k.shape[2:]
    s = _tuple(strides, ns, "strides")
    p = _tuple(padding, ns, "padding")
    op = _tuple(output_padding, ns, "output_padding")
    d = _tuple(dilation, ns, "dilation")
    for opi, si, di in zip(op, s, d, strict=True):
        if opi >= max(si, di) or opi < 0:
            raise ValueError(
                f"conv_transpose: output_padding {op} must be >= 0 and smaller than stride "
                f"{s} or dilation {d} (PyTorch's rule)."
            )
    sizes = xc.shape[2:]
    full = [
        (m - 1) * si + (ki - 1) * di + 1 for m, si, ki, di in zip(sizes, s, ksize, d, strict=True)
    ]
    out = [f - 2 * pi + opi for f, pi, opi in zip(full, p, op, strict=True)]
    if any(v <= 0 for v in out):
        raise ValueError(f"conv_transpose: padding {p} leaves no output (size {out}).")
    buf = np.zeros((n, groups, o_per_group, *[f + opi for f, opi in zip(full, op, strict=True)]))
    xg = xc.reshape((n, groups, c // groups) + sizes)
    kg = k.reshape((groups, c // groups) + k.shape[1:])
    ss = _SPATIAL[:ns]
    for offset in itertools.product(*(range(ki) for ki in ksize)):
        contrib = np.einsum(f"ngc{ss},gco->ngo{ss}", xg, kg[(Ellipsis, *offset)])
        # Each input position scatters into output position m * s + offset * d.
        window = tuple(
            slice(i * di, i * di + (m - 1) * si + 1, si)
            for i, di, m, si in zip(offset, d, sizes, s, strict=True)
        )
        buf[(slice(None), slice(None), slice(None), *window)] += contrib
    crop = tuple(slice(pi, pi + oi) for pi, oi in zip(p, out, strict=True))
    y = buf[(slice(None), slice(None), slice(None), *crop)]
    y = y.reshape((n, groups * o_per_group, *out))
    if bias is not None:
        y = y + _per_channel(_channel_vector(bias, y.shape[1], 0.0, "bias"), y.ndim)
    return _from_cf(y, lay)


def _pool_windows(
    x: Any,
    window: int | Sequence[int],
    strides: int | Sequence[int] | None,
    padding: Padding,
    layout: Any,
    pad_value: float,
    where: str,
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]], _Layout]:
    x = _f64(x)
    lay = _layout(layout, x, where)
    ns = lay.num_spatial
    win = _tuple(window, ns, "window")
    s = win if strides is None else _tuple(strides, ns, "strides")
    xc = _to_cf(x, lay)
    pads = _pads(padding, xc.shape[2:], win, s, (1,) * ns)
    patches = _windows(_pad(xc, pads, pad_value), win, s, (1,) * ns)
    return patches, xc, pads, lay


def max_pool(
    x: Any,
    window: int | Sequence[int],
    strides: int | Sequence[int] | None = None,
    padding: Padding = 0,
    *,
    layout: Any,
) -> np.ndarray:
    """Max pooling; padding is filled with ``-inf``. ``strides`` defaults to ``window``
    (PyTorch); ``padding`` as in ``conv``."""
    patches, _, _, lay = _pool_windows(x, window, strides, padding, layout, -np.inf, "max_pool")
    ns = lay.num_spatial
    return _from_cf(patches.max(axis=tuple(range(2, 2 + ns))), lay)


def avg_pool(
    x: Any,
    window: int | Sequence[int],
    strides: int | Sequence[int] | None = None,
    padding: Padding = 0,
    count_include_pad: bool = True,
    *,
    layout: Any,
) -> np.ndarray:
    """Average pooling. ``count_include_pad=True`` divides by the full window size (PyTorch's
    and Flax's default); ``False`` divides by the number of real (unpadded) elements."""
    patches, xc, pads, lay = _pool_windows(x, window, strides, padding, layout, 0.0, "avg_pool")
    ns = lay.num_spatial
    axes = tuple(range(2, 2 + ns))
    total = patches.sum(axis=axes)
    win = patches.shape[2 : 2 + ns]
    if count_include_pad:
        return _from_cf(total / math.prod(win), lay)
    ones = np.ones((1, 1) + xc.shape[2:])
    strides_t = win if strides is None else _tuple(strides, ns, "strides")
    counts = _windows(_pad(ones, pads, 0.0), win, strides_t, (1,) * ns).sum(axis=axes)
    return _from_cf(total / counts, lay)


def _adaptive_bounds(n: int, o: int) -> list[tuple[int, int]]:
    return [((i * n) // o, -((-(i + 1) * n) // o)) for i in range(o)]


def adaptive_avg_pool(x: Any, output_size: int | Sequence[int | None], layout: Any) -> np.ndarray:
    """PyTorch ``adaptive_avg_pool``: output cell ``i`` averages input
    ``[floor(i * n / o), ceil((i + 1) * n / o))``; ``None`` keeps that dim's size."""
    x = _f64(x)
    lay = _layout(layout, x, "adaptive_avg_pool")
    xc = _to_cf(x, lay)
    sizes = xc.shape[2:]
    if isinstance(output_size, int | np.integer):
        out = (int(output_size),) * lay.num_spatial
    else:
        out = tuple(n if o is None else int(o) for o, n in zip(output_size, sizes, strict=True))
    if any(o <= 0 for o in out):
        raise ValueError(f"adaptive_avg_pool: output_size must be positive, got {out}.")
    bounds = [_adaptive_bounds(n, o) for n, o in zip(sizes, out, strict=True)]
    y = np.empty(xc.shape[:2] + out)
    for cell in itertools.product(*(range(o) for o in out)):
        region = tuple(slice(*bounds[d][i]) for d, i in enumerate(cell))
        y[(slice(None), slice(None), *cell)] = xc[(slice(None), slice(None), *region)].mean(
            axis=tuple(range(2, 2 + lay.num_spatial))
        )
    return _from_cf(y, lay)


def global_avg_pool(x: Any, layout: Any) -> np.ndarray:
    """Mean over all spatial dims: ``(N, C)``."""
    x = _f64(x)
    lay = _layout(layout, x, "global_avg_pool")
    return _to_cf(x, lay).mean(axis=tuple(range(2, x.ndim)))


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
    x = _f64(x)
    lay = _layout(layout, x, "batch_norm")
    xc = _to_cf(x, lay)
    c = xc.shape[1]
    if (mean is None) != (var is None):
        raise ValueError("batch_norm: give both mean and var, or neither for batch statistics.")
    if mean is None:
        m = xc.mean(axis=_stat_axes(xc.ndim))
        v = xc.var(axis=_stat_axes(xc.ndim))
    else:
        m = _channel_vector(mean, c, 0.0, "batch_norm mean")
        v = _channel_vector(var, c, 1.0, "batch_norm var")
    g = _channel_vector(scale, c, 1.0, "batch_norm scale")
    b = _channel_vector(bias, c, 0.0, "batch_norm bias")
    y = (xc - _per_channel(m, xc.ndim)) / np.sqrt(_per_channel(v, xc.ndim) + eps)
    y = y * _per_channel(g, xc.ndim) + _per_channel(b, xc.ndim)
    return _from_cf(y, lay)


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
    x = _f64(x)
    lay = _layout(layout, x, "batch_norm_running_update")
    xc = _to_cf(x, lay)
    c = xc.shape[1]
    count = xc.size // c
    if unbiased and count < 2:
        raise ValueError(
            "batch_norm_running_update: the unbiased variance needs more than one value per "
            f"channel, got input shape {x.shape}."
        )
    batch_mean = xc.mean(axis=_stat_axes(xc.ndim))
    batch_var = xc.var(axis=_stat_axes(xc.ndim), ddof=1 if unbiased else 0)
    rm = _channel_vector(running_mean, c, 0.0, "running_mean")
    rv = _channel_vector(running_var, c, 1.0, "running_var")
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
    x = _f64(x)
    lay = _layout(layout, x, "group_norm")
    xc = _to_cf(x, lay)
    n, c = xc.shape[:2]
    if num_groups < 1 or c % num_groups:
        raise ValueError(f"group_norm: num_groups={num_groups} must divide channels ({c}).")
    xg = xc.reshape((n, num_groups, -1))
    mean = xg.mean(axis=2, keepdims=True)
    var = xg.var(axis=2, keepdims=True)
    y = ((xg - mean) / np.sqrt(var + eps)).reshape(xc.shape)
    g = _channel_vector(scale, c, 1.0, "group_norm scale")
    b = _channel_vector(bias, c, 0.0, "group_norm bias")
    y = y * _per_channel(g, y.ndim) + _per_channel(b, y.ndim)
    return _from_cf(y, lay)


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
    x = _f64(x)
    lay = _layout(layout, x, "upsample_nearest")
    xc = _to_cf(x, lay)
    for axis, sc in enumerate(_scales(scale, lay.num_spatial), start=2):
        n = xc.shape[axis]
        out = math.floor(n * sc)
        src = np.minimum(np.floor(np.arange(out) * (1.0 / sc)).astype(int), n - 1)
        xc = np.take(xc, src, axis=axis)
    return _from_cf(xc, lay)


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
    x = _f64(x)
    lay = _layout(layout, x, "upsample_bilinear")
    xc = _to_cf(x, lay)
    for axis, sc in enumerate(_scales(scale, lay.num_spatial), start=2):
        xc = _linear_axis(xc, axis, sc, align_corners)
    return _from_cf(xc, lay)


def dense(x: Any, kernel: Any, bias: Any = None) -> np.ndarray:
    """``x @ kernel + bias`` with ``kernel`` of shape ``(in, out)``."""
    x, k = _f64(x), _f64(kernel)
    if k.ndim != 2 or x.shape[-1] != k.shape[0]:
        raise ValueError(
            f"dense: kernel must be (in, out) with in = {x.shape[-1]}, got shape {k.shape}."
        )
    y = x @ k
    if bias is not None:
        y = y + _channel_vector(bias, k.shape[1], 0.0, "dense bias")
    return y


def flatten(x: Any, layout: Any, order: str = "CHW") -> np.ndarray:
    """``(N, features)``. ``order="CHW"`` flattens channels-first, as PyTorch flattens an NCHW
    tensor, whatever ``layout`` is; ``"HWC"`` flattens channels-last (any rank)."""
    x = _f64(x)
    lay = _layout(layout, x, "flatten")
    order = order.upper()
    if order not in ("CHW", "HWC"):
        raise ValueError(f"flatten: order must be 'CHW' or 'HWC', got {order!r}.")
    xc = _to_cf(x, lay)
    if order == "HWC":
        xc = np.moveaxis(xc, 1, -1)
    return xc.reshape((xc.shape[0], -1))


def relu(x: Any) -> np.ndarray:
    return np.maximum(_f64(x), 0.0)


def softmax_cross_entropy(logits: Any, labels: Any) -> np.ndarray:
    """Per-example cross entropy (no reduction). ``labels`` are integer class indices of
    shape ``logits.shape[:-1]`` or probabilities of ``logits``'s shape."""
    z = _f64(logits)
    labels = np.asarray(labels)
    shifted = z - z.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    if labels.shape == z.shape and not np.issubdtype(labels.dtype, np.integer):
        return -(labels.astype(np.float64) * log_probs).sum(axis=-1)
    if labels.shape != z.shape[:-1] or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"softmax_cross_entropy: labels must be integer indices of shape {z.shape[:-1]} or "
            f"probabilities of shape {z.shape}, got {labels.dtype} {labels.shape}."
        )
    if labels.size and (labels.min() < 0 or labels.max() >= z.shape[-1]):
        raise ValueError(
            f"softmax_cross_entropy: labels must be in [0, {z.shape[-1]}), got "
            f"[{labels.min()}, {labels.max()}]."
        )
    return -np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
