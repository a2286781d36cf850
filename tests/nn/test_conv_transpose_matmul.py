"""``ConvTranspose``'s one-dot form for non-overlapping taps, against float64 NumPy.

Forward: ``numpy_ref.conv_transpose``. Gradients, computed independently of both lowerings:
the input gradient of a transposed conv is the strided conv of the output gradient with the
same kernel (its adjoint, ``numpy_ref.conv``); the kernel gradient of tap ``a`` is the input
contracted with the output gradient's stride-``s`` slice at offset ``a``.

Tolerance: rtol 1e-5, atol 1e-5, as in ``test_nn_vs_numpy``: every value is a float32 sum of
at most 60 products of O(1) terms (the kernel gradient sums over 2 x 5 x 6 positions), whose
rounding error is about sqrt(60) * eps32 ~ 1e-6 relative; an indexing or interleaving bug
is O(1).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from layoutlab import nn
from layoutlab.compare import numpy_ref as ref
from layoutlab.compare.report import assert_close
from layoutlab.layout import Layout, parse_layout

RTOL = ATOL = 1e-5


def _layer(layout, algorithm="auto", kernel=2, cin=4, cout=3):
    return nn.ConvTranspose(cin, cout, kernel, strides=kernel, layout=parse_layout(layout),
                            algorithm=algorithm, rngs=nnx.Rngs(0))  # fmt: skip


def _x(layout, spatial, cin=4, seed=0):
    shape = parse_layout(layout).shape(2, cin, spatial)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("layout", ["NDHWC", "NCDHW"])
def test_3d_matches_numpy(layout):
    layer = _layer(layout, "matmul")
    x = _x(layout, (3, 4, 2))
    expected = ref.conv_transpose(
        x,
        np.asarray(layer.kernel[...], np.float64),
        np.asarray(layer.bias[...], np.float64),
        strides=2,
        layout=parse_layout(layout),
    )
    assert_close(np.asarray(layer(x)), expected, rtol=RTOL, atol=ATOL, name=layout)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_gradients_match_numpy(layout):
    lay = parse_layout(layout)
    layer = _layer(layout)
    x = _x(layout, (5, 6))
    g = np.random.default_rng(1).standard_normal(np.shape(layer(x))).astype(np.float32)
    graphdef, params = nnx.split(layer)

    def loss(p, x):
        return jnp.sum(nnx.merge(graphdef, p)(x) * g)

    dp, dx = jax.grad(loss, argnums=(0, 1))(params, jnp.asarray(x))
    kernel = np.asarray(layer.kernel[...], np.float64)
    # As a conv from the output channels back to the input ones the same array is the
    # kernel: (in, out, k, k) is OIHW in channels-first; in channels-last (k, k, in, out)
    # swaps to HWIO.
    conv_kernel = kernel if not lay.is_channels_last else np.swapaxes(kernel, -1, -2)
    expected_dx = ref.conv(g.astype(np.float64), conv_kernel, strides=2, padding=0, layout=lay)
    assert_close(np.asarray(dx), expected_dx, rtol=RTOL, atol=ATOL, name="dx")

    x_last = x if lay.is_channels_last else np.moveaxis(x, 1, -1)
    g_last = g if lay.is_channels_last else np.moveaxis(g, 1, -1)
    taps = np.zeros((2, 2, 4, 3))
    for a in range(2):
        for b in range(2):
            taps[a, b] = np.einsum("nhwi,nhwo->io", x_last, g_last[:, a::2, b::2, :])
    expected_dk = taps if lay.is_channels_last else np.transpose(taps, (2, 3, 0, 1))
    assert_close(np.asarray(dp["kernel"][...]), expected_dk, rtol=RTOL, atol=ATOL, name="dk")
    expected_db = g.sum(axis=tuple(i for i in range(g.ndim) if i != lay.channel_axis))
    assert_close(np.asarray(dp["bias"][...]), expected_db, rtol=RTOL, atol=ATOL, name="db")


@pytest.mark.parametrize(
    "kw, dilated",
    [
        (dict(kernel_size=2, strides=2), False),  # auto: the taps do not overlap
        (dict(kernel_size=2, strides=2, algorithm="xla"), True),
        (dict(kernel_size=3, strides=2), True),  # auto with overlapping taps
        (dict(kernel_size=2, strides=2, padding=1), True),
    ],
)
def test_which_form_runs(kw, dilated):
    layer = nn.ConvTranspose(4, 3, layout=Layout.NHWC, rngs=nnx.Rngs(0), **kw)
    jaxpr = str(jax.make_jaxpr(layer)(jnp.zeros((1, 4, 4, 4))))
    assert ("lhs_dilation=(2, 2)" in jaxpr) == dilated, jaxpr


def test_bad_algorithms_name_the_fix():
    with pytest.raises(ValueError, match="non-overlapping taps.*use 'auto' or 'xla'"):
        nn.ConvTranspose(4, 3, 3, strides=2, algorithm="matmul", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="Unknown ConvTranspose algorithm 'dot'; use one of"):
        nn.ConvTranspose(4, 3, 2, strides=2, algorithm="dot", rngs=nnx.Rngs(0))
