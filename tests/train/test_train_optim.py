"""float32_state: half-precision params get a float32 optimizer, and optax's extra args pass."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from layoutlab.train.optim import float32_state


def test_float32_state_matches_adam_on_float32_copies():
    # Reference: optax's Adam on float32 copies of the params, its update rounded to float16
    # once. float32_state must give exactly that (one rounding, no float16 state).
    params = {"w": jnp.asarray([0.5, -1.25, 3.0], jnp.float16)}
    grads = {"w": jnp.asarray([1e-4, -2e-3, 0.25], jnp.float16)}
    tx = float32_state(optax.adam(1e-3))
    state = tx.init(params)
    assert float_dtypes(state) == {np.dtype(np.float32)}
    ref_tx = optax.adam(1e-3)
    f32 = {"w": params["w"].astype(jnp.float32)}
    # optax's bias correction mixes int32 and float scalars, as the train step allows it.
    with jax.numpy_dtype_promotion("standard"):
        update, _ = tx.update(grads, state, params)
        ref, _ = ref_tx.update({"w": grads["w"].astype(jnp.float32)}, ref_tx.init(f32), f32)
    assert update["w"].dtype == jnp.float16
    np.testing.assert_array_equal(np.asarray(update["w"]), np.asarray(ref["w"], np.float16))


def test_float32_state_forwards_extra_args_through_chain():
    # An inner transformation that needs optax's `value` extra argument, the way
    # optax.contrib.reduce_on_plateau does: it must reach it through chain and the wrapper.
    seen = []

    def update(updates, state, params=None, *, value):
        seen.append(value)
        return updates, state

    needs_value = optax.GradientTransformationExtraArgs(lambda p: optax.EmptyState(), update)
    tx = optax.chain(float32_state(needs_value))
    params = {"w": jnp.ones((2,), jnp.bfloat16)}
    state = tx.init(params)
    tx.update(params, state, params, value=jnp.float32(3.5))
    assert len(seen) == 1 and float(seen[0]) == 3.5


def float_dtypes(tree):
    leaves = jax.tree.leaves(tree)
    return {np.dtype(x.dtype) for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)}
