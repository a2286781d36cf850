"""Padding rules (TF/XLA ``SAME``, ``VALID``, explicit) and im2col windows for the float64
conv and pooling references."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

__all__ = ["Padding", "pad_spatial", "same_padding", "sliding_windows", "window_pads"]


Padding = str | int | Sequence[int] | Sequence[tuple[int, int]]


def same_padding(size: int, kernel: int, stride: int = 1, dilation: int = 1) -> tuple[int, int]:
    """TF/XLA ``SAME`` padding: the output has ``ceil(size / stride)`` positions."""
    extent = (kernel - 1) * dilation + 1
    total = max((math.ceil(size / stride) - 1) * stride + extent - size, 0)
    return total // 2, total - total // 2


def window_pads(
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


def sliding_windows(
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


def pad_spatial(x: np.ndarray, pads: Sequence[tuple[int, int]], value: float) -> np.ndarray:
    return np.pad(x, [(0, 0), (0, 0), *pads], constant_values=value)
