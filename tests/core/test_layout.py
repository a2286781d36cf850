"""Layout enum helpers, activation/kernel conversion and their errors."""

import numpy as np
import pytest

from layoutlab import Layout, parse_layout, to_layout
from layoutlab.layout import (
    channels_first,
    channels_last,
    convert_kernel,
    hwio_to_oihw,
    oihw_to_hwio,
)


@pytest.mark.parametrize(
    "layout, channel_axis, spatial, kernel",
    [
        ("NWC", 2, (1,), "WIO"),
        ("NCW", 1, (2,), "OIW"),
        ("NHWC", 3, (1, 2), "HWIO"),
        ("NCHW", 1, (2, 3), "OIHW"),
        ("NDHWC", 4, (1, 2, 3), "DHWIO"),
        ("NCDHW", 1, (2, 3, 4), "OIDHW"),
    ],
)
def test_axes(layout, channel_axis, spatial, kernel):
    lay = Layout(layout)
    assert lay.channel_axis == channel_axis
    assert lay.spatial_axes == spatial
    assert lay.kernel_layout == kernel
    assert lay.rank == len(layout)
    assert lay.dimension_numbers == (layout, kernel, layout)
    assert lay.counterpart.counterpart == lay
    assert lay.counterpart.channel_axis != lay.channel_axis


def test_parse_is_case_insensitive_and_checks_rank():
    assert parse_layout("nchw") is Layout.NCHW
    assert parse_layout(Layout.NHWC, rank=4) is Layout.NHWC
    with pytest.raises(ValueError, match="valid layouts are: .*NHWC.*NCHW"):
        parse_layout("NHCW")
    with pytest.raises(ValueError, match="valid layouts for rank 5 are: NDHWC, NCDHW"):
        parse_layout("NHWC", rank=5)
    with pytest.raises(ValueError, match="valid layouts are"):
        parse_layout(4)
    with pytest.raises(ValueError, match="spatial dims"):
        channels_last(4)
    with pytest.raises(ValueError, match="spatial dims"):
        channels_first(0)


def test_to_layout_round_trip_and_values():
    x = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)  # NHWC
    y = to_layout(x, "NHWC", "NCHW")
    assert y.shape == (2, 5, 3, 4)
    # element (n, h, w, c) must land at (n, c, h, w)
    assert y[1, 4, 2, 3] == x[1, 2, 3, 4]
    np.testing.assert_array_equal(to_layout(y, "NCHW", "NHWC"), x)
    with pytest.raises(ValueError, match="rank 4"):
        to_layout(x, "NDHWC", "NCDHW")


def test_kernel_conversion_1d_2d_3d():
    k = np.random.default_rng(0).normal(size=(3, 5, 2, 7))  # HWIO
    o = hwio_to_oihw(k)
    assert o.shape == (7, 2, 3, 5)
    assert o[6, 1, 2, 4] == k[2, 4, 1, 6]
    np.testing.assert_array_equal(oihw_to_hwio(o), k)
    k1 = np.zeros((3, 2, 4))  # WIO
    assert hwio_to_oihw(k1).shape == (4, 2, 3)
    k3 = np.zeros((1, 2, 3, 4, 5))  # DHWIO
    assert convert_kernel(k3, "NDHWC", "NCDHW").shape == (5, 4, 1, 2, 3)


def test_shape_and_input_check_messages():
    assert Layout.NCHW.shape(8, 3, (32, 16)) == (8, 3, 32, 16)
    assert Layout.NHWC.shape(8, 3, (32, 16)) == (8, 32, 16, 3)
    with pytest.raises(
        ValueError, match="expects NHWC input with 3 channels on axis 3.*looks like NCHW"
    ):
        Layout.NHWC.check_input((8, 3, 32, 32), 3, "Conv")
    with pytest.raises(ValueError, match="rank 4, got shape \\(8, 32, 32\\)"):
        Layout.NHWC.check_input((8, 32, 32), 3, "Conv")
