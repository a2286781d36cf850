"""Layout names, channels-first moves and per-channel vectors for the float64 references.

The layout is read from its name alone (``"NHWC"`` or anything whose ``value`` is one), not
from ``layoutlab.layout``, so a bug there cannot hide in both the op and its reference."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "RefLayout",
    "add_bias",
    "channel_vector",
    "f64",
    "from_channels_first",
    "int_tuple",
    "per_channel",
    "read_layout",
    "to_channels_first",
]

_LAYOUTS = ("NWC", "NCW", "NHWC", "NCHW", "NDHWC", "NCDHW")


class RefLayout(NamedTuple):
    name: str
    channels_last: bool
    num_spatial: int


def read_layout(layout: Any, x: np.ndarray, where: str) -> RefLayout:
    name = str(getattr(layout, "value", layout)).upper()
    if name not in _LAYOUTS:
        raise ValueError(f"{where}: unknown layout {layout!r}; valid layouts are {_LAYOUTS}.")
    if x.ndim != len(name):
        raise ValueError(
            f"{where}: layout {name} needs a rank-{len(name)} input, got shape {x.shape}."
        )
    return RefLayout(name, name.endswith("C"), len(name) - 2)


def f64(x: Any) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def to_channels_first(x: np.ndarray, lay: RefLayout) -> np.ndarray:
    return np.moveaxis(x, -1, 1) if lay.channels_last else x


def from_channels_first(x: np.ndarray, lay: RefLayout) -> np.ndarray:
    return np.moveaxis(x, 1, -1) if lay.channels_last else x


def int_tuple(value: int | Sequence[int], n: int, what: str) -> tuple[int, ...]:
    if isinstance(value, int | np.integer):
        return (int(value),) * n
    value = tuple(int(v) for v in value)
    if len(value) != n:
        raise ValueError(f"{what} needs 1 or {n} values, got {value}.")
    return value


def channel_vector(v: Any, c: int, default: float, what: str) -> np.ndarray:
    if v is None:
        return np.full((c,), default)
    v = f64(v)
    if v.shape != (c,):
        raise ValueError(f"{what} must have shape ({c},), got {v.shape}.")
    return v


def per_channel(v: np.ndarray, ndim: int) -> np.ndarray:
    """Shape a (C,) vector to broadcast over a channels-first (N, C, spatial...) array."""
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def add_bias(y: np.ndarray, bias: Any, what: str) -> np.ndarray:
    """Channels-first ``y`` plus a per-channel ``bias`` of shape (C,)."""
    return y + per_channel(channel_vector(bias, y.shape[1], 0.0, what), y.ndim)
