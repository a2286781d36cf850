"""Float64 max, average, adaptive-average and global-average pooling."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from layoutlab.compare.numpy_ref.layouts import (
    RefLayout,
    f64,
    from_channels_first,
    int_tuple,
    read_layout,
    to_channels_first,
)
from layoutlab.compare.numpy_ref.windows import Padding, pad_spatial, sliding_windows, window_pads

__all__ = ["max_pool", "avg_pool", "adaptive_avg_pool", "global_avg_pool"]


def _pool_windows(
    x: Any,
    window: int | Sequence[int],
    strides: int | Sequence[int] | None,
    padding: Padding,
    layout: Any,
    pad_value: float,
    where: str,
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]], RefLayout]:
    x = f64(x)
    lay = read_layout(layout, x, where)
    ns = lay.num_spatial
    win = int_tuple(window, ns, "window")
    s = win if strides is None else int_tuple(strides, ns, "strides")
    xc = to_channels_first(x, lay)
    pads = window_pads(padding, xc.shape[2:], win, s, (1,) * ns)
    patches = sliding_windows(pad_spatial(xc, pads, pad_value), win, s, (1,) * ns)
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
    return from_channels_first(patches.max(axis=tuple(range(2, 2 + ns))), lay)


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
        return from_channels_first(total / math.prod(win), lay)
    ones = np.ones((1, 1) + xc.shape[2:])
    strides_t = win if strides is None else int_tuple(strides, ns, "strides")
    counts = sliding_windows(pad_spatial(ones, pads, 0.0), win, strides_t, (1,) * ns).sum(axis=axes)
    return from_channels_first(total / counts, lay)


def _adaptive_bounds(n: int, o: int) -> list[tuple[int, int]]:
    return [((i * n) // o, -((-(i + 1) * n) // o)) for i in range(o)]


def adaptive_avg_pool(x: Any, output_size: int | Sequence[int | None], layout: Any) -> np.ndarray:
    """PyTorch ``adaptive_avg_pool``: output cell ``i`` averages input
    ``[floor(i * n / o), ceil((i + 1) * n / o))``; ``None`` keeps that dim's size."""
    x = f64(x)
    lay = read_layout(layout, x, "adaptive_avg_pool")
    xc = to_channels_first(x, lay)
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
    return from_channels_first(y, lay)


def global_avg_pool(x: Any, layout: Any) -> np.ndarray:
    """Mean over all spatial dims: ``(N, C)``."""
    x = f64(x)
    lay = read_layout(layout, x, "global_avg_pool")
    return to_channels_first(x, lay).mean(axis=tuple(range(2, x.ndim)))
