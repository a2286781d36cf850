"""Logical tensor layouts: which axis is the channel axis, and how to move between layouts.

A ``Layout`` names the *logical* order of an activation's axes. XLA is free to choose a
different physical order; ``layoutlab.xla`` shows what it chose. Kernels follow the layout:
channels-last layouts keep kernels as ``HWIO`` (spatial..., in, out), channels-first layouts
keep them as ``OIHW`` (out, in, spatial...), the PyTorch convention.
"""

from __future__ import annotations

import enum

import jax.numpy as jnp
import numpy as np

__all__ = [
    "Layout",
    "parse_layout",
    "to_layout",
    "convert_kernel",
    "hwio_to_oihw",
    "oihw_to_hwio",
    "channels_last",
    "channels_first",
]


class Layout(enum.StrEnum):
    NWC = "NWC"
    NCW = "NCW"
    NHWC = "NHWC"
    NCHW = "NCHW"
    NDHWC = "NDHWC"
    NCDHW = "NCDHW"

    @property
    def rank(self) -> int:
        return len(self.value)

    @property
    def num_spatial(self) -> int:
        return self.rank - 2

    @property
    def is_channels_last(self) -> bool:
        return self.value.endswith("C")

    @property
    def channel_axis(self) -> int:
        return self.rank - 1 if self.is_channels_last else 1

    @property
    def spatial_axes(self) -> tuple[int, ...]:
        start = 1 if self.is_channels_last else 2
        return tuple(range(start, start + self.num_spatial))

    @property
    def kernel_layout(self) -> str:
        """Kernel axis order used by layers in this layout, e.g. ``HWIO`` or ``OIHW``."""
        spatial = self.value[1:-1] if self.is_channels_last else self.value[2:]
        return spatial + "IO" if self.is_channels_last else "OI" + spatial

    @property
    def dimension_numbers(self) -> tuple[str, str, str]:
        """``(lhs, rhs, out)`` spec for ``lax.conv_general_dilated``."""
        return (self.value, self.kernel_layout, self.value)

    @property
    def counterpart(self) -> Layout:
        """The layout of the same rank with the channel axis on the other side."""
        return (
            channels_first(self.num_spatial)
            if self.is_channels_last
            else channels_last(self.num_spatial)
        )

    def perm_to(self, dst: Layout | str) -> tuple[int, ...]:
        dst = parse_layout(dst, rank=self.rank)
        return tuple(self.value.index(ax) for ax in dst.value)

    def channels(self, shape: tuple[int, ...]) -> int:
        return shape[self.channel_axis]

    def spatial_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(shape[a] for a in self.spatial_axes)

    def shape(self, batch: int, channels: int, spatial: tuple[int, ...]) -> tuple[int, ...]:
        """The array shape of ``batch`` examples with ``channels`` and ``spatial`` size."""
        if len(spatial) != self.num_spatial:
            raise ValueError(
                f"{self.value} has {self.num_spatial} spatial dims, got spatial size {spatial}"
            )
        if self.is_channels_last:
            return (batch, *spatial, channels)
        return (batch, channels, *spatial)

    def check_input(self, x_shape: tuple[int, ...], channels: int | None, where: str) -> None:
        """Raise a ``ValueError`` naming the layout if ``x_shape`` does not fit this layout."""
        if len(x_shape) != self.rank:
            raise ValueError(
                f"{where} expects {self.value} input of rank {self.rank}, got shape "
                f"{tuple(x_shape)} (rank {len(x_shape)})."
            )
        if channels is not None and x_shape[self.channel_axis] != channels:
            other = self.counterpart
            hint = ""
            if x_shape[other.channel_axis] == channels:
                hint = (
                    f" The input looks like {other.value}: convert it with "
                    f"layoutlab.to_layout(x, '{other.value}', '{self.value}') or build the "
                    f"model with layout='{other.value}'."
                )
            raise ValueError(
                f"{where} expects {self.value} input with {channels} channels on axis "
                f"{self.channel_axis}, got shape {tuple(x_shape)}.{hint}"
            )


_BY_RANK = {
    1: (Layout.NWC, Layout.NCW),
    2: (Layout.NHWC, Layout.NCHW),
    3: (Layout.NDHWC, Layout.NCDHW),
}


def _choices(rank: int | None = None) -> str:
    layouts = [lay for lay in Layout if rank is None or lay.rank == rank]
    return ", ".join(lay.value for lay in layouts)


def parse_layout(layout: Layout | str, *, rank: int | None = None) -> Layout:
    """Turn a string such as ``"nchw"`` into a ``Layout``; ``rank`` checks the array rank."""
    if isinstance(layout, Layout):
        result = layout
    elif isinstance(layout, str) and layout.upper() in Layout.__members__:
        result = Layout[layout.upper()]
    else:
        raise ValueError(f"Unknown layout {layout!r}; valid layouts are: {_choices()}.")
    if rank is not None and result.rank != rank:
        raise ValueError(
            f"Layout {result.value} is for rank-{result.rank} arrays, but the array has rank "
            f"{rank}; valid layouts for rank {rank} are: {_choices(rank) or 'none'}."
        )
    return result


def channels_last(num_spatial: int) -> Layout:
    if num_spatial not in _BY_RANK:
        raise ValueError(f"No layout with {num_spatial} spatial dims; use 1, 2 or 3.")
    return _BY_RANK[num_spatial][0]


def channels_first(num_spatial: int) -> Layout:
    if num_spatial not in _BY_RANK:
        raise ValueError(f"No layout with {num_spatial} spatial dims; use 1, 2 or 3.")
    return _BY_RANK[num_spatial][1]


def to_layout(x, src: Layout | str, dst: Layout | str):
    """Transpose an activation from layout ``src`` to ``dst`` (a no-op when they are equal)."""
    src = parse_layout(src, rank=np.ndim(x))
    dst = parse_layout(dst, rank=np.ndim(x))
    if src == dst:
        return x
    perm = src.perm_to(dst)
    if isinstance(x, np.ndarray):
        return np.transpose(x, perm)
    return jnp.transpose(x, perm)


def _kernel_perm(src: str, dst: str) -> tuple[int, ...]:
    return tuple(src.index(ax) for ax in dst)


def convert_kernel(kernel, src: Layout | str, dst: Layout | str):
    """Move a conv kernel from the kernel order of layout ``src`` to that of ``dst``."""
    rank = np.ndim(kernel)
    src = parse_layout(src, rank=rank)
    dst = parse_layout(dst, rank=rank)
    if src == dst:
        return kernel
    perm = _kernel_perm(src.kernel_layout, dst.kernel_layout)
    if isinstance(kernel, np.ndarray):
        return np.transpose(kernel, perm)
    return jnp.transpose(kernel, perm)


def hwio_to_oihw(kernel):
    """``(spatial..., I, O)`` -> ``(O, I, spatial...)`` for 1D, 2D or 3D kernels."""
    return convert_kernel(
        kernel, channels_last(np.ndim(kernel) - 2), channels_first(np.ndim(kernel) - 2)
    )


def oihw_to_hwio(kernel):
    """``(O, I, spatial...)`` -> ``(spatial..., I, O)`` for 1D, 2D or 3D kernels."""
    return convert_kernel(
        kernel, channels_first(np.ndim(kernel) - 2), channels_last(np.ndim(kernel) - 2)
    )
