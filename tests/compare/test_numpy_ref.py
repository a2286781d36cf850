"""Cross-check the float64 NumPy reference ops against PyTorch's functional ops in float64.

PyTorch is channels-first, so channels-last variants are transposed in and out here with plain
``np.moveaxis`` (not layoutlab.layout, to keep the check independent). Tolerance: both sides
compute in float64 and differ only in summation order, so differences are ~1e-15 relative;
1e-10 leaves room for that while any indexing, padding or window bug shows up as O(1) errors.
"""

import math

import numpy as np
import pytest

from layoutlab.compare import numpy_ref as ref

torch = pytest.importorskip("torch")
F = torch.nn.functional

TOL = 1e-10  # float64 vs float64, only summation order differs (see module docstring)

CHANNELS_FIRST = {1: "NCW", 2: "NCHW", 3: "NCDHW"}
CHANNELS_LAST = {1: "NWC", 2: "NHWC", 3: "NDHWC"}
SPATIAL = {1: (7,), 2: (6, 5), 3: (5, 4, 6)}


def rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def t(x):
    return torch.from_numpy(np.ascontiguousarray(x))


def close(actual, expected):
    expected = expected.detach().numpy() if isinstance(expected, torch.Tensor) else expected
    np.testing.assert_allclose(actual, expected, rtol=TOL, atol=TOL)


def layout_of(ns, channels_last):
    return CHANNELS_LAST[ns] if channels_last else CHANNELS_FIRST[ns]


def run(fn, x_cf, ns, channels_last, *args, **kwargs):
    """Call ``fn`` on the channels-first array ``x_cf`` in the requested layout and return its
    result in channels-first order."""
    layout = layout_of(ns, channels_last)
    x = np.moveaxis(x_cf, 1, -1) if channels_last else x_cf
    y = fn(x, *args, layout=layout, **kwargs)
    return np.moveaxis(y, -1, 1) if channels_last else y


def oi_to_io_last(kernel):
    """(O, I, *K) -> (*K, I, O): the channels-last kernel order."""
    ns = kernel.ndim - 2
    return np.transpose(kernel, (*range(2, 2 + ns), 1, 0))


def io_to_io_last(kernel):
    """(I, O, *K) -> (*K, I, O): channels-last order of a transposed-conv kernel."""
    ns = kernel.ndim - 2
    return np.transpose(kernel, (*range(2, 2 + ns), 0, 1))


def torch_pad(x, pads, value=0.0):
    flat = [p for lo_hi in reversed(pads) for p in lo_hi]  # F.pad lists the last dim first
    return F.pad(t(x), flat, value=value)


def tf_same(n, k, s, d=1):
    # Written out from the definition: output ceil(n / s), any odd extra pad goes at the end.
    out = -(-n // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - n, 0)
    return (total // 2, total - total // 2)


TORCH_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
TORCH_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
TORCH_MAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
TORCH_AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
TORCH_ADAPTIVE = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}
LINEAR_MODE = {1: "linear", 2: "bilinear", 3: "trilinear"}

LAYOUTS = pytest.mark.parametrize("channels_last", [False, True], ids=["cfirst", "clast"])
RANKS = pytest.mark.parametrize("ns", [1, 2, 3], ids=["1d", "2d", "3d"])

CONV_CASES = {
    "same_s1": dict(cin=3, cout=4, k=3, stride=1, dilation=1, groups=1, padding="SAME"),
    "same_s2_asym": dict(cin=3, cout=4, k=4, stride=2, dilation=1, groups=1, padding="SAME"),
    "valid_dil2": dict(cin=2, cout=4, k=2, stride=1, dilation=2, groups=1, padding="VALID"),
    "same_dil2": dict(cin=2, cout=3, k=3, stride=1, dilation=2, groups=1, padding="SAME"),
    "int_groups2_s2": dict(cin=4, cout=6, k=3, stride=2, dilation=1, groups=2, padding=1),
    "depthwise_pairs": dict(cin=3, cout=6, k=3, stride=1, dilation=1, groups=3, padding="pairs"),
}


@LAYOUTS
@RANKS
@pytest.mark.parametrize("case", list(CONV_CASES), ids=list(CONV_CASES))
def test_conv_matches_torch(case, ns, channels_last):
    c = CONV_CASES[case]
    x = rand((2, c["cin"], *SPATIAL[ns]), seed=1)
    w = rand((c["cout"], c["cin"] // c["groups"], *(c["k"],) * ns), seed=2)
    b = rand((c["cout"],), seed=3)
    if c["padding"] == "SAME":
        pads = [tf_same(n, c["k"], c["stride"], c["dilation"]) for n in SPATIAL[ns]]
        padding = "SAME"
    elif c["padding"] == "VALID":
        pads, padding = [(0, 0)] * ns, "VALID"
    elif c["padding"] == "pairs":
        pads = [(1, 0), (0, 2), (2, 1)][:ns]
        padding = pads
    else:
        pads, padding = [(c["padding"],) * 2] * ns, c["padding"]
    expected = TORCH_CONV[ns](
        torch_pad(x, pads),
        t(w),
        t(b),
        stride=c["stride"],
        dilation=c["dilation"],
        groups=c["groups"],
    )
    kernel = oi_to_io_last(w) if channels_last else w
    actual = run(
        ref.conv,
        x,
        ns,
        channels_last,
        kernel,
        b,
        strides=c["stride"],
        padding=padding,
        dilation=c["dilation"],
        groups=c["groups"],
    )
    close(actual, expected)


def test_same_padding_rule():
    # Hand-worked TF/XLA SAME values, the odd pixel going to the high side.
    assert ref.same_padding(5, 3, 2) == (1, 1)
    assert ref.same_padding(6, 3, 2) == (0, 1)
    assert ref.same_padding(4, 4, 1) == (1, 2)
    assert ref.same_padding(7, 3, 1, 2) == (2, 2)
    assert ref.same_padding(4, 1, 4) == (0, 0)


CONV_T_CASES = {
    "s2_p1_op1": dict(cin=3, cout=2, k=3, stride=2, padding=1, output_padding=1, dilation=1, g=1),
    "s1_dil2": dict(cin=2, cout=3, k=2, stride=1, padding=0, output_padding=0, dilation=2, g=1),
    "s3_groups2": dict(cin=4, cout=6, k=3, stride=3, padding=2, output_padding=2, dilation=1, g=2),
}


@LAYOUTS
@RANKS
@pytest.mark.parametrize("case", list(CONV_T_CASES), ids=list(CONV_T_CASES))
def test_conv_transpose_matches_torch(case, ns, channels_last):
    c = CONV_T_CASES[case]
    spatial = SPATIAL[ns][:ns]
    x = rand((2, c["cin"], *spatial), seed=4)
    w = rand((c["cin"], c["cout"] // c["g"], *(c["k"],) * ns), seed=5)
    b = rand((c["cout"],), seed=6)
    expected = TORCH_CONV_T[ns](
        t(x),
        t(w),
        t(b),
        stride=c["stride"],
        padding=c["padding"],
        output_padding=c["output_padding"],
        groups=c["g"],
        dilation=c["dilation"],
    )
    kernel = io_to_io_last(w) if channels_last else w
    actual = run(
        ref.conv_transpose,
        x,
        ns,
        channels_last,
        kernel,
        b,
        strides=c["stride"],
        padding=c["padding"],
        output_padding=c["output_padding"],
        dilation=c["dilation"],
        groups=c["g"],
    )
    assert actual.shape == tuple(expected.shape)
    close(actual, expected)


POOL_CASES = {
    "w2": dict(window=2, strides=None, padding=0),
    "w3_s2_p1": dict(window=3, strides=2, padding=1),
    "w3_s1_p1": dict(window=3, strides=1, padding=1),
}


@LAYOUTS
@RANKS
@pytest.mark.parametrize("case", list(POOL_CASES), ids=list(POOL_CASES))
def test_max_pool_matches_torch(case, ns, channels_last):
    c = POOL_CASES[case]
    x = rand((2, 3, *SPATIAL[ns]), seed=7)
    expected = TORCH_MAX[ns](
        t(x), c["window"], stride=c["strides"] or c["window"], padding=c["padding"]
    )
    actual = run(ref.max_pool, x, ns, channels_last, c["window"], c["strides"], c["padding"])
    close(actual, expected)


@LAYOUTS
@RANKS
@pytest.mark.parametrize("count_include_pad", [True, False], ids=["incl_pad", "excl_pad"])
@pytest.mark.parametrize("case", list(POOL_CASES), ids=list(POOL_CASES))
def test_avg_pool_matches_torch(case, count_include_pad, ns, channels_last):
    c = POOL_CASES[case]
    x = rand((2, 3, *SPATIAL[ns]), seed=8)
    expected = TORCH_AVG[ns](
        t(x),
        c["window"],
        stride=c["strides"] or c["window"],
        padding=c["padding"],
        count_include_pad=count_include_pad,
    )
    actual = run(
        ref.avg_pool,
        x,
        ns,
        channels_last,
        c["window"],
        c["strides"],
        c["padding"],
        count_include_pad=count_include_pad,
    )
    close(actual, expected)


@LAYOUTS
@pytest.mark.parametrize("ns", [2, 3], ids=["2d", "3d"])
def test_same_pooling_matches_explicit_padding(ns, channels_last):
    # SAME with stride 2 on odd/even sizes pads asymmetrically; torch only pads symmetrically,
    # so pad explicitly (-inf for max, zeros for avg with the pad counted).
    x = rand((1, 2, *SPATIAL[ns]), seed=9)
    pads = [tf_same(n, 3, 2) for n in SPATIAL[ns]]
    expected_max = TORCH_MAX[ns](torch_pad(x, pads, value=-math.inf), 3, stride=2)
    expected_avg = TORCH_AVG[ns](torch_pad(x, pads), 3, stride=2)
    close(run(ref.max_pool, x, ns, channels_last, 3, 2, "SAME"), expected_max)
    close(run(ref.avg_pool, x, ns, channels_last, 3, 2, "same"), expected_avg)


ADAPTIVE_OUT = {1: (3,), 2: (4, 2), 3: (2, 3, 4)}


@LAYOUTS
@RANKS
def test_adaptive_avg_pool_matches_torch(ns, channels_last):
    # Output sizes that do not divide the input, so windows overlap and differ in size.
    x = rand((2, 3, *SPATIAL[ns]), seed=10)
    expected = TORCH_ADAPTIVE[ns](t(x), ADAPTIVE_OUT[ns])
    close(run(ref.adaptive_avg_pool, x, ns, channels_last, ADAPTIVE_OUT[ns]), expected)


@LAYOUTS
def test_adaptive_avg_pool_upsamples_like_torch(channels_last):
    x = rand((1, 2, 3, 2), seed=11)
    expected = F.adaptive_avg_pool2d(t(x), (5, 3))
    close(run(ref.adaptive_avg_pool, x, 2, channels_last, (5, 3)), expected)


@LAYOUTS
@RANKS
def test_global_avg_pool(ns, channels_last):
    x = rand((2, 3, *SPATIAL[ns]), seed=12)
    expected = t(x).mean(dim=tuple(range(2, 2 + ns)))
    actual = ref.global_avg_pool(
        np.moveaxis(x, 1, -1) if channels_last else x, layout_of(ns, channels_last)
    )
    assert actual.shape == (2, 3)
    close(actual, expected)


@LAYOUTS
@RANKS
def test_batch_norm_matches_torch(ns, channels_last):
    x = rand((3, 4, *SPATIAL[ns]), seed=13)
    scale, bias = rand((4,), seed=14), rand((4,), seed=15)
    mean, var = rand((4,), seed=16), np.abs(rand((4,), seed=17)) + 0.5
    expected_eval = F.batch_norm(t(x), t(mean), t(var), t(scale), t(bias), training=False, eps=1e-3)
    actual_eval = run(
        ref.batch_norm, x, ns, channels_last, scale, bias, mean=mean, var=var, eps=1e-3
    )
    close(actual_eval, expected_eval)

    running_mean, running_var = t(mean.copy()), t(var.copy())
    expected_train = F.batch_norm(
        t(x), running_mean, running_var, t(scale), t(bias), training=True, momentum=0.1
    )
    close(run(ref.batch_norm, x, ns, channels_last, scale, bias), expected_train)
    # torch updated running_mean/var in place, with the unbiased batch variance.
    new_mean, new_var = run_stats(x, ns, channels_last, mean, var)
    close(new_mean, running_mean)
    close(new_var, running_var)


def run_stats(x_cf, ns, channels_last, mean, var):
    x = np.moveaxis(x_cf, 1, -1) if channels_last else x_cf
    return ref.batch_norm_running_update(
        mean, var, x, momentum=0.1, layout=layout_of(ns, channels_last)
    )


def test_batch_norm_running_update_biased_option():
    # Flax-style update: biased variance, momentum is the new-batch weight here.
    x = rand((4, 2, 3, 3), seed=18)
    mean, var = ref.batch_norm_running_update(
        np.zeros(2), np.ones(2), x, momentum=0.25, layout="NCHW", unbiased=False
    )
    close(mean, 0.25 * x.mean(axis=(0, 2, 3)))
    close(var, 0.75 + 0.25 * x.var(axis=(0, 2, 3)))


@LAYOUTS
@RANKS
def test_group_norm_matches_torch(ns, channels_last):
    x = rand((2, 6, *SPATIAL[ns]), seed=19)
    scale, bias = rand((6,), seed=20), rand((6,), seed=21)
    expected = F.group_norm(t(x), 3, t(scale), t(bias), eps=1e-5)
    close(run(ref.group_norm, x, ns, channels_last, 3, scale, bias), expected)


NEAREST_SCALES = {1: [2, 3], 2: [2, (2, 3)], 3: [2, (1, 2, 3)]}


@LAYOUTS
@RANKS
def test_upsample_nearest_matches_torch(ns, channels_last):
    x = rand((1, 2, *SPATIAL[ns]), seed=22)
    for scale in NEAREST_SCALES[ns]:
        expected = F.interpolate(t(x), scale_factor=scale, mode="nearest")
        close(run(ref.upsample_nearest, x, ns, channels_last, scale), expected)


@LAYOUTS
@RANKS
@pytest.mark.parametrize("align_corners", [False, True], ids=["half_pixel", "align_corners"])
def test_upsample_linear_matches_torch(align_corners, ns, channels_last):
    x = rand((1, 2, *SPATIAL[ns]), seed=23)
    for scale in NEAREST_SCALES[ns]:
        expected = F.interpolate(
            t(x), scale_factor=scale, mode=LINEAR_MODE[ns], align_corners=align_corners
        )
        actual = run(ref.upsample_bilinear, x, ns, channels_last, scale, align_corners)
        close(actual, expected)


def test_upsample_bilinear_fractional_scale_matches_torch():
    x = rand((1, 2, 4, 6), seed=24)
    for align_corners in (False, True):
        expected = F.interpolate(
            t(x), scale_factor=1.5, mode="bilinear", align_corners=align_corners
        )
        close(ref.upsample_bilinear(x, 1.5, align_corners, layout="NCHW"), expected)


def test_dense_relu_matches_torch():
    x, k, b = rand((3, 5), seed=25), rand((5, 4), seed=26), rand((4,), seed=27)
    close(ref.dense(x, k, b), F.linear(t(x), t(k.T), t(b)))
    close(ref.relu(x), F.relu(t(x)))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_flatten_orders(layout):
    x_cf = rand((2, 3, 4, 5), seed=28)
    x = np.moveaxis(x_cf, 1, -1) if layout == "NHWC" else x_cf
    close(ref.flatten(x, layout, order="CHW"), torch.flatten(t(x_cf), 1))
    close(ref.flatten(x, layout, order="HWC"), torch.flatten(t(x_cf).permute(0, 2, 3, 1), 1))


def test_softmax_cross_entropy_matches_torch():
    logits = rand((4, 5), seed=29) * 10  # large logits exercise the max-shift
    labels = np.array([0, 4, 2, 2])
    expected = F.cross_entropy(t(logits), t(labels), reduction="none")
    close(ref.softmax_cross_entropy(logits, labels), expected)
    probs = np.random.default_rng(30).dirichlet(np.ones(5), size=4)
    expected_soft = F.cross_entropy(t(logits), t(probs), reduction="none")
    close(ref.softmax_cross_entropy(logits, probs), expected_soft)


def test_bad_inputs_raise_clear_errors():
    x = np.zeros((1, 4, 5, 5))
    with pytest.raises(ValueError, match="unknown layout"):
        ref.conv(x, np.zeros((2, 4, 3, 3)), layout="NHCW")
    with pytest.raises(ValueError, match="rank-4 input"):
        ref.max_pool(np.zeros((1, 4, 5)), 2, layout="NCHW")
    with pytest.raises(ValueError, match="input channels per group"):
        ref.conv(x, np.zeros((2, 3, 3, 3)), layout="NCHW")
    with pytest.raises(ValueError, match="groups=3 must divide"):
        ref.conv(x, np.zeros((3, 1, 3, 3)), groups=3, layout="NCHW")
    with pytest.raises(ValueError, match="output_padding"):
        ref.conv_transpose(x, np.zeros((4, 2, 3, 3)), strides=1, output_padding=1, layout="NCHW")
    with pytest.raises(ValueError, match="labels must be in"):
        ref.softmax_cross_entropy(np.zeros((2, 3)), np.array([0, 3]))
