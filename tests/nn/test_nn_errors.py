"""Layers reject bad arguments and mismatched inputs with messages that say what to fix."""

import jax.numpy as jnp
import pytest
from flax import nnx

from layoutlab import nn
from layoutlab.layout import Layout


def test_conv_channel_mismatch_names_layout_channels_and_shape():
    conv = nn.Conv(3, 8, 3, layout=Layout.NCHW, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError) as err:
        conv(jnp.zeros((2, 16, 16, 3), jnp.float32))
    msg = str(err.value)
    assert "NCHW" in msg and "3 channels" in msg and "(2, 16, 16, 3)" in msg
    assert "looks like NHWC" in msg


@pytest.mark.parametrize(
    "layer, x_shape",
    [
        (lambda: nn.BatchNorm(4, layout=Layout.NHWC), (2, 4, 5, 5)),
        (lambda: nn.GroupNorm(2, 4, layout=Layout.NCHW), (2, 5, 5, 4)),
        (
            lambda: nn.ConvTranspose(4, 2, 2, strides=2, layout=Layout.NHWC, rngs=nnx.Rngs(0)),
            (1, 4, 3, 3),
        ),
    ],
)
def test_channel_mismatch_in_other_layers(layer, x_shape):
    with pytest.raises(ValueError, match="4 channels on axis"):
        layer()(jnp.zeros(x_shape, jnp.float32))


def test_rank_mismatch_for_pooling_and_3d():
    with pytest.raises(ValueError, match="expects NDHWC input of rank 5"):
        nn.MaxPool(2, layout=Layout.NDHWC)(jnp.zeros((1, 4, 4, 3), jnp.float32))
    with pytest.raises(ValueError, match="expects NCHW input of rank 4"):
        nn.GlobalAvgPool(layout=Layout.NCHW)(jnp.zeros((1, 3), jnp.float32))


def test_dense_feature_mismatch():
    dense = nn.Dense(12, 3, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="12 features on the last axis, got shape \\(2, 10\\)"):
        dense(jnp.zeros((2, 10), jnp.float32))


def test_bad_arguments():
    with pytest.raises(ValueError, match="divisible by groups"):
        nn.Conv(3, 8, 3, groups=2, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="Unknown padding 'FULL'"):
        nn.Conv(3, 8, 3, padding="FULL", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="kernel_size needs 2 values"):
        nn.Conv(3, 8, (3, 3, 3), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="padding needs 3 entries"):
        nn.MaxPool(2, padding=(1, 1), layout=Layout.NDHWC)
    with pytest.raises(ValueError, match="GroupNorm: num_features \\(6\\) must be divisible"):
        nn.GroupNorm(4, 6)
    with pytest.raises(ValueError, match="Unknown upsampling method 'cubic'"):
        nn.Upsample(2, method="cubic")
    with pytest.raises(ValueError, match="Flatten order must be"):
        nn.Flatten(order="WHC")
    with pytest.raises(ValueError, match="output_padding"):
        nn.ConvTranspose(2, 2, 3, strides=2, output_padding=2, rngs=nnx.Rngs(0))


def test_flatten_order_is_the_same_in_both_layouts():
    x_nchw = jnp.arange(2 * 3 * 2 * 2, dtype=jnp.float32).reshape(2, 3, 2, 2)
    x_nhwc = jnp.transpose(x_nchw, (0, 2, 3, 1))
    a = nn.Flatten(layout=Layout.NCHW)(x_nchw)
    b = nn.Flatten(layout=Layout.NHWC)(x_nhwc)
    # CHW order is PyTorch's flatten of an NCHW tensor: a plain reshape of it.
    assert jnp.array_equal(a, x_nchw.reshape(2, -1)) and jnp.array_equal(a, b)
    c = nn.Flatten(order="HWC", layout=Layout.NCHW)(x_nchw)
    assert jnp.array_equal(c, x_nhwc.reshape(2, -1))
