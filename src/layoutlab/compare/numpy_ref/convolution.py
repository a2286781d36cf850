"""Float64 convolution and transposed convolution, with groups and dilation."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from layoutlab.compare.numpy_ref.layouts import (
    add_bias,
    f64,
    from_channels_first,
    int_tuple,
    read_layout,
    to_channels_first,
)
from layoutlab.compare.numpy_ref.windows import Padding, pad_spatial, sliding_windows, window_pads

__all__ = ["conv", "conv_transpose"]


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
    x = f64(x)
    lay = read_layout(layout, x, "conv")
    ns = lay.num_spatial
    k = f64(kernel)
    if k.ndim != ns + 2:
        raise ValueError(f"conv: {lay.name} needs a rank-{ns + 2} kernel, got shape {k.shape}.")
    if lay.channels_last:
        k = np.moveaxis(k, (-1, -2), (0, 1))  # (*K, I, O) -> (O, I, *K)
    xc = to_channels_first(x, lay)
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
    strides_t = int_tuple(strides, ns, "strides")
    dil = int_tuple(dilation, ns, "dilation")
    pads = window_pads(padding, xc.shape[2:], ksize, strides_t, dil)
    patches = sliding_windows(pad_spatial(xc, pads, 0.0), ksize, strides_t, dil)
    patches = patches.reshape((n, groups, c // groups) + patches.shape[2:])
    kg = k.reshape((groups, o // groups) + k.shape[1:])
    ks, os_ = _SPATIAL[:ns], _OUT[:ns]
    y = np.einsum(f"ngc{ks}{os_},goc{ks}->ngo{os_}", patches, kg, optimize=True)
    y = y.reshape((n, o) + y.shape[3:])
    if bias is not None:
        y = add_bias(y, bias, "conv bias")
    return from_channels_first(y, lay)


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
    x = f64(x)
    lay = read_layout(layout, x, "conv_transpose")
    ns = lay.num_spatial
    k = f64(kernel)
    if k.ndim != ns + 2:
        raise ValueError(
            f"conv_transpose: {lay.name} needs a rank-{ns + 2} kernel, got shape {k.shape}."
        )
    if lay.channels_last:
        k = np.moveaxis(k, (-2, -1), (0, 1))  # (*K, I, O/g) -> (I, O/g, *K)
    xc = to_channels_first(x, lay)
    n, c = xc.shape[:2]
    if groups < 1 or c % groups:
        raise ValueError(f"conv_transpose: groups={groups} must divide in channels ({c}).")
    if k.shape[0] != c:
        raise ValueError(
            f"conv_transpose: kernel has {k.shape[0]} input channels, the input has {c}."
        )
    o_per_group = k.shape[1]
    ksize = k.shape[2:]
    s = int_tuple(strides, ns, "strides")
    p = int_tuple(padding, ns, "padding")
    op = int_tuple(output_padding, ns, "output_padding")
    d = int_tuple(dilation, ns, "dilation")
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
        y = add_bias(y, bias, "bias")
    return from_channels_first(y, lay)
