"""The geometry of one 2D convolution: explicit padding, output size, and its cache key."""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from layoutlab.nn.padding import Padding, normalize_padding, normalize_tuple, same_padding

__all__ = ["ConvSpec", "Geometry", "Pairs", "kernel_to_hwio", "make_spec", "resolve_geometry"]


Pairs = tuple[tuple[int, int], ...]


class Geometry(NamedTuple):
    """Static conv parameters with the padding resolved to explicit ``(lo, hi)`` pairs.

    Hashable, so it can be a ``nondiff_argnums`` of a ``jax.custom_vjp``.
    """

    kernel_size: tuple[int, int]
    strides: tuple[int, int]
    padding: Pairs
    dilation: tuple[int, int]
    groups: int

    def out_size(self, in_size: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(
            (n + lo + hi - (k - 1) * d - 1) // s + 1
            for n, (lo, hi), k, d, s in zip(
                in_size, self.padding, self.kernel_size, self.dilation, self.strides, strict=True
            )
        )


def resolve_geometry(
    in_size: tuple[int, ...],
    kernel_size: int | tuple[int, ...],
    strides: int | tuple[int, ...] = 1,
    padding: Padding = "SAME",
    dilation: int | tuple[int, ...] = 1,
    groups: int = 1,
) -> Geometry:
    """``Geometry`` for an input of spatial size ``in_size`` (``SAME`` follows XLA's rule)."""
    n = len(in_size)
    kernel = normalize_tuple(kernel_size, n, "kernel_size")
    stride = normalize_tuple(strides, n, "strides")
    dil = normalize_tuple(dilation, n, "dilation")
    pad = normalize_padding(padding, n)
    if pad == "SAME":
        pad = tuple(
            same_padding(size, k, s, d)
            for size, k, s, d in zip(in_size, kernel, stride, dil, strict=True)
        )
    elif pad == "VALID":
        pad = ((0, 0),) * n
    geom = Geometry(kernel, stride, tuple(pad), dil, int(groups))
    out = geom.out_size(tuple(in_size))
    if any(o <= 0 for o in out):
        raise ValueError(
            f"conv: kernel {kernel} with dilation {dil} does not fit the padded input "
            f"{tuple(in_size)} with padding {pad}; use a smaller kernel or more padding."
        )
    return geom


class ConvSpec(NamedTuple):
    """Everything that decides which algorithm is fastest for one conv call."""

    batch: int
    in_size: tuple[int, int]
    in_features: int
    out_features: int
    geometry: Geometry
    dtype: str
    layout: str

    @property
    def reduction(self) -> int:
        """Terms summed per output element: ``kh * kw * in_features / groups``."""
        kh, kw = self.geometry.kernel_size
        return kh * kw * self.in_features // self.geometry.groups

    @property
    def out_size(self) -> tuple[int, ...]:
        return self.geometry.out_size(self.in_size)

    def key(self) -> str:
        """A stable text key, e.g. ``NHWC:n32:32x32:64->64:k3x3:s1x1:p1-1,1-1:d1x1:g1:float32``."""
        g = self.geometry
        pad = ",".join(f"{lo}-{hi}" for lo, hi in g.padding)
        return (
            f"{self.layout}:n{self.batch}:{self.in_size[0]}x{self.in_size[1]}:"
            f"{self.in_features}->{self.out_features}:k{g.kernel_size[0]}x{g.kernel_size[1]}:"
            f"s{g.strides[0]}x{g.strides[1]}:p{pad}:d{g.dilation[0]}x{g.dilation[1]}:"
            f"g{g.groups}:{self.dtype}"
        )


def make_spec(
    x_shape: tuple[int, ...],
    out_features: int,
    geometry: Geometry,
    dtype,
    layout: str,
) -> ConvSpec:
    """``ConvSpec`` of a 2D conv on an input of ``x_shape`` in ``layout`` (NHWC or NCHW)."""
    if layout == "NHWC":
        n, h, w, c = x_shape
    elif layout == "NCHW":
        n, c, h, w = x_shape
    else:
        raise ValueError(f"conv algorithms handle 2D layouts NHWC and NCHW, got {layout!r}.")
    return ConvSpec(
        int(n), (int(h), int(w)), int(c), int(out_features), geometry, np.dtype(dtype).name, layout
    )


def kernel_to_hwio(kernel, kernel_layout: str):
    """``kernel`` (axes in ``kernel_layout``, a permutation of ``"HWIO"``) as HWIO."""
    if kernel_layout == "HWIO":
        return kernel
    return jnp.transpose(kernel, tuple(kernel_layout.index(c) for c in "HWIO"))
