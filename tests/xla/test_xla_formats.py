"""Physical layouts through the Format/Layout API: AUTO compiles, chosen layouts, placement."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from layoutlab.xla import (
    LayoutUnsupportedError,
    compare_layouts,
    compile_report,
    layout_api,
    major_to_minor_for,
    physical_format,
)


def conv_nchw(x, w):
    return lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW")
    )


def conv_reference(x, w):
    """float64 NCHW/OIHW SAME conv, stride 1, odd kernel, by explicit patch sums."""
    n, _, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2)))
    out = np.zeros((n, o, h, wd))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i : i + h, j : j + wd], w[:, :, i, j])
    return out


@pytest.fixture(scope="module")
def arrays():
    rng = np.random.default_rng(0)
    return rng.standard_normal((2, 3, 8, 8), np.float32), rng.standard_normal(
        (4, 3, 3, 3), np.float32
    )


@pytest.fixture(scope="module")
def comparison(arrays):
    x, w = arrays
    try:
        return compare_layouts(conv_nchw, x, w, backend="cpu", repeats=3)
    except LayoutUnsupportedError as err:
        pytest.skip(f"this backend refuses Layout.AUTO: {err}")


def test_layout_api_found():
    api = layout_api()
    assert api.auto is not None and api.compiled_inputs in ("input_formats", "input_layouts")


def test_auto_layouts_are_reported_and_drop_a_transpose(comparison):
    default, auto = comparison.default, comparison.auto
    (out_default,) = default.output_formats
    (out_auto,) = auto.output_formats
    assert out_default["is_default"] is True
    # XLA's CPU conv runs NHWC; free to choose, it returns the NCHW result stored NHWC, so
    # the output transpose is gone.
    assert out_auto["major_to_minor"] == (0, 2, 3, 1)
    assert auto.hlo.totals()["memory_permutations"] < default.hlo.totals()["memory_permutations"]
    assert len(auto.input_formats) == 2
    assert comparison.default_seconds > 0 and comparison.auto_seconds > 0
    assert "memory_permutations" in comparison.table()


def test_auto_layout_results_match_reference(comparison, arrays):
    x, w = arrays
    ref = conv_reference(x, w)
    for report in (comparison.default, comparison.auto):
        out = np.asarray(report.run(x, w))
        # f32 sums of 27 products of unit normals: errors ~1e-6 relative; 1e-5 leaves margin.
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_explicit_physical_formats(arrays):
    x, w = arrays
    assert major_to_minor_for("NCHW", "NHWC") == (0, 2, 3, 1)
    assert major_to_minor_for("OIHW", "HWIO") == (2, 3, 1, 0)
    dev = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    out_fmt = physical_format("NCHW", "NHWC", dev)
    report = compile_report(conv_nchw, x, w, backend="cpu", out_formats=out_fmt)
    assert report.output_formats[0]["major_to_minor"] == (0, 2, 3, 1)
    assert report.output_formats[0]["is_default"] is False
    with pytest.raises(ValueError, match="same distinct axis letters"):
        major_to_minor_for("NCHW", "NHWX")


def test_bad_format_spec_is_clear():
    with pytest.raises(ValueError, match="'auto', None or Format"):
        compile_report(jnp.sin, jax.ShapeDtypeStruct((4,), jnp.float32), in_formats="nhwc")
