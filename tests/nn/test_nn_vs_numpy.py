"""layoutlab.nn layers against the float64 NumPy references, in both layouts.

Tolerance: rtol 1e-5, atol 1e-5. A float32 layer output is a sum of at most K = 72 products
(3x3 kernel x 8 input channels) of O(1) values; its rounding error is about sqrt(K) * eps32 *
sum|terms| ~ 1e-6 here (Higham's worst case K * eps32 * sum|terms| ~ 1e-4 is never reached by
random rounding). Normalizations divide by a std of O(1). 1e-5 is an order of magnitude above
the typical error and three below the O(0.1) error of any indexing or layout bug.
"""

import numpy as np
import pytest
from compare_helpers import random_layer
from flax import nnx

from layoutlab import nn
from layoutlab.compare import numpy_ref as ref
from layoutlab.compare.report import assert_close
from layoutlab.layout import Layout, channels_first, channels_last, to_layout

RTOL = ATOL = 1e-5


def _input(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _w(var):
    return None if var is None else np.asarray(var[...], np.float64)


def _cases(num_spatial):
    last, first = channels_last(num_spatial), channels_first(num_spatial)
    return [pytest.param(last, id=last.value), pytest.param(first, id=first.value)]


def _run(factory, layout, x_last, **call_kw):
    """The layer moved to ``layout`` and called on ``x_last`` moved there too."""
    layer = random_layer(factory, layout=layout.value)
    src = channels_last(layout.num_spatial)
    x = np.asarray(to_layout(x_last, src, layout))
    return layer, x, np.asarray(layer(x, **call_kw))


CONV_CASES = {
    "stride2_same": dict(kernel_size=3, strides=2, padding="SAME"),
    "pad1_dilated": dict(kernel_size=3, padding=2, dilation=2),
    "asym_pairs": dict(kernel_size=(3, 2), padding=((1, 0), (0, 1))),
    "groups2": dict(kernel_size=3, padding=1, groups=2),
    "depthwise": dict(kernel_size=3, padding=1, groups=4, out=8),
}


@pytest.mark.parametrize("layout", _cases(2))
@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d(case, layout):
    kw = dict(CONV_CASES[case])
    out = kw.pop("out", 6)
    factory = lambda: nn.Conv(4, out, layout=Layout.NHWC, rngs=nnx.Rngs(0), **kw)
    layer, x, y = _run(factory, layout, _input((2, 7, 8, 4)))
    expected = ref.conv(
        x,
        _w(layer.kernel),
        _w(layer.bias),
        strides=layer.strides,
        padding=kw.get("padding", "SAME"),
        dilation=layer.dilation,
        groups=layer.groups,
        layout=layout,
    )
    assert_close(y, expected, rtol=RTOL, atol=ATOL, name=f"conv {case} {layout}")


@pytest.mark.parametrize("num_spatial", [1, 3])
def test_conv_1d_3d(num_spatial):
    spatial = (9,) if num_spatial == 1 else (4, 5, 6)
    for layout in (channels_last(num_spatial), channels_first(num_spatial)):
        factory = lambda: nn.Conv(3, 5, 3, strides=2, padding=1, layout=channels_last(num_spatial),
                                  rngs=nnx.Rngs(0))  # fmt: skip
        layer, x, y = _run(factory, layout, _input((2, *spatial, 3)))
        expected = ref.conv(
            x, _w(layer.kernel), _w(layer.bias), strides=2, padding=1, layout=layout
        )
        assert_close(y, expected, rtol=RTOL, atol=ATOL, name=f"conv {layout}")


TRANSPOSE_CASES = {
    # 2x2 stride 2 (U-Net's up-sampling): "auto" runs the one-dot "matmul" form.
    "k2s2_auto": dict(kernel_size=2, strides=2),
    "k2s2_xla": dict(kernel_size=2, strides=2, algorithm="xla"),
    "k3s3_matmul": dict(kernel_size=3, strides=3, algorithm="matmul"),
    "k3s2_overlapping": dict(kernel_size=3, strides=2, padding=1, output_padding=1),
}


@pytest.mark.parametrize("layout", _cases(2))
@pytest.mark.parametrize("case", TRANSPOSE_CASES)
def test_conv_transpose(case, layout):
    kw = TRANSPOSE_CASES[case]
    factory = lambda: nn.ConvTranspose(4, 3, layout=Layout.NHWC, rngs=nnx.Rngs(0), **kw)
    layer, x, y = _run(factory, layout, _input((2, 5, 6, 4)))
    expected = ref.conv_transpose(
        x,
        _w(layer.kernel),
        _w(layer.bias),
        strides=layer.strides,
        padding=layer.padding,
        output_padding=layer.output_padding,
        layout=layout,
    )
    assert_close(y, expected, rtol=RTOL, atol=ATOL, name=f"conv_transpose {layout}")


POOL_CASES = {
    "max_3_2_1": (lambda lay: nn.MaxPool(3, 2, 1, layout=lay),
                  lambda x, lay: ref.max_pool(x, 3, 2, 1, layout=lay)),
    "max_2": (lambda lay: nn.MaxPool(2, layout=lay), lambda x, lay: ref.max_pool(x, 2, layout=lay)),
    "avg_3_2_1": (lambda lay: nn.AvgPool(3, 2, 1, layout=lay),
                  lambda x, lay: ref.avg_pool(x, 3, 2, 1, True, layout=lay)),
    "avg_exclude_pad": (lambda lay: nn.AvgPool(3, 2, 1, count_include_pad=False, layout=lay),
                        lambda x, lay: ref.avg_pool(x, 3, 2, 1, False, layout=lay)),
    "adaptive_3": (lambda lay: nn.AdaptiveAvgPool(3, layout=lay),
                   lambda x, lay: ref.adaptive_avg_pool(x, 3, lay)),
    "global": (lambda lay: nn.GlobalAvgPool(layout=lay),
               lambda x, lay: ref.global_avg_pool(x, lay)),
    "nearest_2": (lambda lay: nn.Upsample(2, layout=lay),
                  lambda x, lay: ref.upsample_nearest(x, 2, lay)),
    "bilinear_2": (lambda lay: nn.Upsample(2, method="bilinear", layout=lay),
                   lambda x, lay: ref.upsample_bilinear(x, 2, layout=lay)),
    "bilinear_corners": (
        lambda lay: nn.Upsample(2, method="bilinear", align_corners=True, layout=lay),
        lambda x, lay: ref.upsample_bilinear(x, 2, True, layout=lay),
    ),
}  # fmt: skip


@pytest.mark.parametrize("layout", _cases(2))
@pytest.mark.parametrize("case", POOL_CASES)
def test_pooling_and_upsampling(case, layout):
    make, reference = POOL_CASES[case]
    layer, x, y = _run(lambda: make(Layout.NHWC), layout, _input((2, 7, 7, 3)))
    assert_close(y, reference(x, layout), rtol=RTOL, atol=ATOL, name=f"{case} {layout}")


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("num_spatial", [1, 3])
def test_pooling_1d_3d(num_spatial, kind):
    spatial = (9,) if num_spatial == 1 else (4, 6, 6)
    last = channels_last(num_spatial)
    make = {"max": nn.MaxPool, "avg": nn.AvgPool}[kind]
    reference = {"max": ref.max_pool, "avg": ref.avg_pool}[kind]
    for layout in (last, channels_first(num_spatial)):
        _, x, y = _run(lambda: make(2, 2, layout=last), layout, _input((2, *spatial, 3)))
        assert_close(y, reference(x, 2, layout=layout), rtol=RTOL, atol=ATOL, name=str(layout))


@pytest.mark.parametrize("layout", _cases(2))
def test_batch_norm_train_and_eval(layout):
    factory = lambda: nn.BatchNorm(5, layout=Layout.NHWC)
    layer, x, _ = _run(factory, layout, _input((4, 3, 3, 5)) * 3.0 + 1.0)
    scale, bias = _w(layer.scale), _w(layer.bias)
    mean, var = _w(layer.mean), _w(layer.var)
    y_eval = np.asarray(layer(x, use_running_average=True))
    expected = ref.batch_norm(x, scale, bias, mean=mean, var=var, layout=layout)
    assert_close(y_eval, expected, rtol=RTOL, atol=ATOL, name=f"bn eval {layout}")
    y_train = np.asarray(layer(x, use_running_average=False))
    expected = ref.batch_norm(x, scale, bias, layout=layout)
    assert_close(y_train, expected, rtol=RTOL, atol=ATOL, name=f"bn train {layout}")
    # The train step moved the running stats by PyTorch's rule (unbiased variance).
    new_mean, new_var = ref.batch_norm_running_update(mean, var, x, 0.1, layout=layout)
    assert_close(np.asarray(layer.mean[...]), new_mean, rtol=RTOL, atol=ATOL)
    assert_close(np.asarray(layer.var[...]), new_var, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("layout", _cases(2))
def test_group_norm(layout):
    layer, x, y = _run(
        lambda: nn.GroupNorm(3, 6, layout=Layout.NHWC), layout, _input((2, 4, 5, 6)) * 2.0 - 1.0
    )
    expected = ref.group_norm(x, 3, _w(layer.scale), _w(layer.bias), layout=layout)
    assert_close(y, expected, rtol=RTOL, atol=ATOL, name=f"group_norm {layout}")


@pytest.mark.parametrize("layout", _cases(2))
@pytest.mark.parametrize("order", ["CHW", "HWC"])
def test_flatten_then_dense(order, layout):
    x_last = _input((2, 3, 4, 5))
    x = np.asarray(to_layout(x_last, "NHWC", layout))
    flat = np.asarray(nn.Flatten(order=order, layout=layout)(x))
    assert_close(flat, ref.flatten(x, layout, order), rtol=0.0, atol=0.0)  # a permutation
    dense = random_layer(lambda: nn.Dense(60, 7, rngs=nnx.Rngs(0)))
    y = np.asarray(dense(flat))
    assert_close(y, ref.dense(flat, _w(dense.kernel), _w(dense.bias)), rtol=RTOL, atol=ATOL)
