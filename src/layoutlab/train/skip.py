"""Skip optimizer steps whose gradients hold an inf or NaN, leaving everything bit-identical.

``skip_nonfinite(inner)`` is what ``torch.amp.GradScaler.step`` does for an optimizer: on a
non-finite gradient the inner state is kept, the updates are zero and ``skipped_steps``
counts the step. ``optax.apply_if_finite`` is close but gives up after
``max_consecutive_errors`` and then applies the non-finite update, which would write NaNs
into the params while a dynamic loss scale is still backing off; this wrapper never does.

Bit-identity: the skipped updates are ``-0.0``, because ``x + (-0.0) == x`` bit for bit for
every ``x`` while ``x + 0.0`` turns a ``-0.0`` parameter into ``+0.0``; so
``optax.apply_updates`` leaves the params untouched. ``apply_if_finite_updates`` selects
the old params outright, for update rules other than a plain add.

Gradient accumulation: wrap outermost, ``skip_nonfinite(optax.MultiSteps(inner, k))``. The
wrapper then sees every micro-step, and a skipped one leaves the accumulator and the
micro-step counter as if it never happened (the next good micro-step takes its place).
The other order, ``MultiSteps(skip_nonfinite(inner), k)``, adds the inf to the accumulator,
and since MultiSteps resets it by multiplying by zero (``0 * inf`` is NaN) every later step
is skipped too.

The state is selected with ``jnp.where`` rather than ``lax.cond``: no host round trip for
the predicate on GPU, and the inner update fuses with the select. The inner update still
runs on the bad gradients (its result is discarded), so ``jax_debug_nans`` will flag it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from layoutlab.loss_scale import all_finite

__all__ = [
    "SkipNonFiniteState",
    "skip_nonfinite",
    "skipped_steps",
    "last_step_finite",
    "apply_if_finite_updates",
]


class SkipNonFiniteState(NamedTuple):
    skipped_steps: jax.Array  # int32: steps skipped since init, never reset
    last_finite: jax.Array  # bool: whether the latest gradients were finite
    inner_state: Any


def _negative_zero_like(x):
    zeros = jnp.zeros_like(x)
    return -zeros if jnp.issubdtype(zeros.dtype, jnp.inexact) else zeros


def skip_nonfinite(inner) -> optax.GradientTransformationExtraArgs:
    """Wraps ``inner`` (a GradientTransformation or ``optax.MultiSteps``) to skip bad steps."""
    if not isinstance(inner, optax.GradientTransformation) and hasattr(
        inner, "gradient_transformation"
    ):
        inner = inner.gradient_transformation()
    if not isinstance(inner, optax.GradientTransformation):
        raise TypeError(
            "skip_nonfinite wraps an optax.GradientTransformation (or optax.MultiSteps), "
            f"got {type(inner).__name__}."
        )
    inner = optax.with_extra_args_support(inner)

    def init(params):
        return SkipNonFiniteState(
            skipped_steps=jnp.zeros([], jnp.int32),
            last_finite=jnp.asarray(True),
            inner_state=inner.init(params),
        )

    def update(updates, state, params=None, **extra_args):
        finite = all_finite(updates)
        new_updates, new_inner = inner.update(updates, state.inner_state, params, **extra_args)
        keep = lambda new, old: jnp.where(finite, new, old)
        return jax.tree.map(lambda u: keep(u, _negative_zero_like(u)), new_updates), (
            SkipNonFiniteState(
                skipped_steps=keep(state.skipped_steps, state.skipped_steps + 1),
                last_finite=finite,
                inner_state=jax.tree.map(keep, new_inner, state.inner_state),
            )
        )

    return optax.GradientTransformationExtraArgs(init, update)


def _find_state(opt_state) -> SkipNonFiniteState:
    is_skip = lambda x: isinstance(x, SkipNonFiniteState)
    found = [s for s in jax.tree.leaves(opt_state, is_leaf=is_skip) if is_skip(s)]
    if len(found) != 1:
        raise ValueError(
            f"Expected one skip_nonfinite state in the optimizer state, found {len(found)}; "
            "wrap the whole optimizer once: skip_nonfinite(optax.chain(...))."
        )
    return found[0]


def _value(x) -> jax.Array:
    # flax.nnx.Optimizer wraps state arrays in Variables.
    return x.get_value() if hasattr(x, "get_value") else jnp.asarray(x)


def skipped_steps(opt_state) -> jax.Array:
    """The int32 count of skipped steps, found anywhere in a (nested) optimizer state."""
    return _value(_find_state(opt_state).skipped_steps)


def last_step_finite(opt_state) -> jax.Array:
    """Whether the latest step's gradients were finite (so its updates were applied)."""
    return _value(_find_state(opt_state).last_finite)


def apply_if_finite_updates(params, updates, finite):
    """``optax.apply_updates`` where ``finite``, else the old params bit for bit."""
    new_params = optax.apply_updates(params, updates)
    return jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_params, params)
