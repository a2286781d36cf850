"""The flat-drawn initialisers give jax's own shaped draws bit for bit: drawing flat only
makes model construction compile less, it must not change a single weight."""

import jax
import jax.numpy as jnp
import numpy as np

from layoutlab.nn.init import flat_kaiming_normal_fan_out, flat_uniform


def test_flat_draws_equal_the_shaped_draws():
    # One conv kernel shape: each draw compiles about a second on CPU.
    key, shape, dtype = jax.random.key(7), (3, 3, 3, 8), jnp.float32
    kaiming = jax.nn.initializers.variance_scaling(2.0, "fan_out", "normal")
    np.testing.assert_array_equal(
        np.asarray(flat_kaiming_normal_fan_out(key, shape, dtype)),
        np.asarray(kaiming(key, shape, dtype)),
    )
    np.testing.assert_array_equal(
        np.asarray(flat_uniform(key, shape, dtype, -0.25, 0.25)),
        np.asarray(jax.random.uniform(key, shape, dtype, -0.25, 0.25)),
    )
