"""Random initialisers that draw flat and reshape.

XLA:CPU compiles a multi-dimensional ``jax.random`` draw far more slowly than a flat one of
the same size (seconds against a fraction of a second for a conv kernel), and eager model
construction compiles one per weight shape. The values are identical bit for bit.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

__all__ = ["flat_kaiming_normal_fan_out", "flat_uniform"]


def flat_uniform(key, shape, dtype, minval, maxval):
    return jax.random.uniform(key, (math.prod(shape),), dtype, minval, maxval).reshape(shape)


def flat_kaiming_normal_fan_out(key, shape, dtype):
    """``jax.nn.initializers.variance_scaling(2.0, "fan_out", "normal")`` for a kernel whose
    last axis is its outputs, drawn flat: the same values bit for bit, one small program per
    kernel size instead of three per kernel shape."""
    fan_out = math.prod(shape) // shape[-2]  # receptive field x outputs, as jax counts it
    variance = jnp.array(2.0 / fan_out, dtype=dtype)
    return (jax.random.normal(key, (math.prod(shape),), dtype) * jnp.sqrt(variance)).reshape(shape)
