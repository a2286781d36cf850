"""The ``onednn`` conv under a data-parallel sharding: each device convolves its own rows.

Against the same conv unsharded (one device's program): the forward and the input gradient
move no data between devices, so they must be equal to the bit; the weight gradient adds four
per-device partial sums in another order, so it is held to float32 rounding of a sum of
8 * 6 * 6 * 9 = 2,592 products (rtol 1e-5 of its largest entry).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from layoutlab.nn.conv_algos import conv2d
from layoutlab.nn.conv_algos.onednn import TARGET_PREFIX, available

pytestmark = pytest.mark.skipif(not available(), reason="the oneDNN extension is not available")

X_SHAPE, W_SHAPE = (8, 6, 6, 4), (3, 3, 4, 8)


def _loss(x, w):
    y = conv2d(x, w, padding="SAME", algorithm="onednn")
    return jnp.sum(y * jnp.cos(y)), y


def test_each_device_convolves_its_own_rows():
    assert jax.device_count() == 4, "conftest.py sets 4 fake CPU devices"
    mesh = Mesh(np.asarray(jax.devices()), ("data",))
    x = jax.random.normal(jax.random.key(0), X_SHAPE)
    w = jax.random.normal(jax.random.key(1), W_SHAPE)
    step = jax.jit(jax.value_and_grad(_loss, argnums=(0, 1), has_aux=True))
    (_, y0), (dx0, dw0) = step(x, w)
    xs = jax.device_put(x, NamedSharding(mesh, PartitionSpec("data")))
    wr = jax.device_put(w, NamedSharding(mesh, PartitionSpec()))
    text = step.lower(xs, wr).compile().as_text()
    (_, y1), (dx1, dw1) = step(xs, wr)
    calls = [line for line in text.splitlines() if TARGET_PREFIX in line]
    assert len(calls) == 3, calls  # forward, input gradient, weight gradient
    # Each call sees a quarter of the batch: 2 rows of 8.
    assert all("f32[2,6,6," in line for line in calls if "bwd_weights" not in line), calls
    assert "all-gather" not in text
    np.testing.assert_array_equal(np.asarray(y1), np.asarray(y0))
    np.testing.assert_array_equal(np.asarray(dx1), np.asarray(dx0))
    scale = float(jnp.max(jnp.abs(dw0)))
    np.testing.assert_allclose(np.asarray(dw1), np.asarray(dw0), rtol=0, atol=1e-5 * scale)
