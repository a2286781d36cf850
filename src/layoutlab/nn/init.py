"""Random initialisers that draw flat and reshape.

XLA:CPU compiles a multi-dimensional ``jax.random`` draw far more slowly than a flat one of
the same size (seconds against a fraction of a second for a conv kernel), and eager model
construction compiles one per weight shape. The values are identical bit for bit.
"""

from __future__ import annotations

import math

import jax


def flat_uniform(key, shape, dtype, minval, maxval):
    return jax.random.uniform(key, (math.prod(shape),), dtype, minval, maxval).reshape(shape)
