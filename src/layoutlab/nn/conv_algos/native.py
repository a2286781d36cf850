"""XLA's own convolution, the default and the fallback of every other algorithm."""

from __future__ import annotations

from jax import lax

from layoutlab.nn.conv_algos.geometry import Geometry


def native_conv(x, w, geom: Geometry, preferred, dimension_numbers=("NHWC", "HWIO", "NHWC")):
    """``lax.conv_general_dilated`` with the geometry's explicit padding."""
    return lax.conv_general_dilated(
        x,
        w,
        window_strides=geom.strides,
        padding=geom.padding,
        rhs_dilation=geom.dilation,
        dimension_numbers=dimension_numbers,
        feature_group_count=geom.groups,
        preferred_element_type=preferred,
    )


def supports_all(spec) -> None:
    return None
