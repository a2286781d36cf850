"""XLA's own convolution, the default and the fallback of every other algorithm."""

from __future__ import annotations

import jax
from jax import lax

from layoutlab.nn.conv_algos.geometry import Geometry

__all__ = ["native_conv", "supports_all", "xla_conv"]


def xla_conv(x: jax.Array, w: jax.Array, preferred=None, **conv) -> jax.Array:
    """``lax.conv_general_dilated(x, w, **conv)`` with a ``preferred`` (float32) result
    from half-precision operands, written for the backend compiled for.

    The CPU gets the conv with ``preferred_element_type``. XLA:GPU runs that half x half ->
    f32 conv as f32 x f32 -> f32: it widens both operands and loses the tensor cores' half
    rate (``inspect`` on an H200, ResNet-50 ``mixed_bf16`` inference: 53 of 53 convs run
    f32, 7.96 GB of converts, a step no faster than float32's). Elsewhere the conv returns
    the operands' dtype, as Flax's ``nn.Conv(dtype=bfloat16)`` and autocast write it (cuDNN
    accumulates in float32), and is widened after. ``lax.platform_dependent`` lowers only
    the branch of the platform compiled for, so a program holds one conv, not a branch.
    """
    if preferred is None or preferred == x.dtype:
        return lax.conv_general_dilated(x, w, preferred_element_type=preferred, **conv)

    def wide(x, w):
        return lax.conv_general_dilated(x, w, preferred_element_type=preferred, **conv)

    def narrow(x, w):
        return lax.conv_general_dilated(x, w, **conv).astype(preferred)

    return lax.platform_dependent(x, w, cpu=wide, default=narrow)


def native_conv(x, w, geom: Geometry, preferred, dimension_numbers=("NHWC", "HWIO", "NHWC")):
    """``xla_conv`` with the geometry's explicit padding."""
    return xla_conv(
        x,
        w,
        preferred,
        window_strides=geom.strides,
        padding=geom.padding,
        rhs_dilation=geom.dilation,
        dimension_numbers=dimension_numbers,
        feature_group_count=geom.groups,
    )


def supports_all(spec) -> None:
    return None
