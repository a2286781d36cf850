"""``nn.Dense``'s gradients (its own input-gradient rule, ``linear.dense_matmul``) against
float64 NumPy, at one row, several rows and extra batch axes, in every policy.

Tolerances: float32 computes sums of at most 6 products of O(1) terms (rtol 1e-5, atol
1e-6: float32 rounding is ~1e-7 relative). The half policies round the inputs and kernel
to the compute dtype before the products (relative error 2^-8 for bfloat16, 2^-11 for
float16, each factor), so their gradients are held to 4e-2 and 5e-3 of the float64 values;
a wrong contraction or transpose is O(1).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from layoutlab import nn
from layoutlab.compare.report import assert_close
from layoutlab.precision import get_policy

TOLERANCE = {"fp32": (1e-5, 1e-6), "mixed_bf16": (4e-2, 4e-2), "mixed_fp16": (5e-3, 5e-3)}


@pytest.mark.parametrize("policy", list(TOLERANCE))
@pytest.mark.parametrize("shape", [(1, 6), (3, 6), (2, 3, 6)])
def test_gradients_match_float64(policy, shape):
    rtol, atol = TOLERANCE[policy]
    layer = nn.Dense(6, 4, policy=get_policy(policy), rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(layer)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    g = np.random.default_rng(1).standard_normal((*shape[:-1], 4))

    def loss(p, x):
        return jnp.sum(nnx.merge(graphdef, p)(x).astype(jnp.float32) * g.astype(np.float32))

    dp, dx = jax.grad(loss, argnums=(0, 1))(params, jnp.asarray(x))
    kernel = np.asarray(params["kernel"][...], np.float64)
    rows, grows = x.reshape(-1, 6).astype(np.float64), g.reshape(-1, 4)
    assert dx.dtype == np.float32 and dp["kernel"][...].dtype == np.float32
    assert_close(np.asarray(dx), g @ kernel.T, rtol=rtol, atol=atol, name="dx")
    assert_close(np.asarray(dp["kernel"][...]), rows.T @ grows, rtol=rtol, atol=atol, name="dk")
    assert_close(np.asarray(dp["bias"][...]), grows.sum(0), rtol=rtol, atol=atol, name="db")
