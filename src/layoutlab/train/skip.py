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

Two ways to branch (``branch``): ``"select"`` computes the inner update and keeps the old state with
``jnp.where``: no host round trip for the predicate on GPU, where the update fuses with the select;
the update still runs on bad gradients (its result is discarded), so ``jax_debug_nans`` flags it.
``"cond"`` runs the update under ``lax.cond`` only on finite gradients. On XLA:CPU the selects are
extra passes over every parameter and optimizer state, so ``"cond"`` is faster there
(docs/performance/measurements.md#skipping-non-finite-steps). The two branches skip the same steps
and agree to float32 rounding, not bit for bit: XLA fuses the update differently in a conditional.
``fast_defaults.default_skip_branch`` picks ``"cond"`` on CPU and ``"select"`` elsewhere.

A training step calls ``update_and_apply``: it hands its own ``all_finite`` verdict to the
wrapper (``grads_finite``), so the gradients are checked once, and with ``"cond"`` the
optimizer update and ``apply_updates`` run in one conditional, where XLA fuses across them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from layoutlab.loss_scale import all_finite

__all__ = [
    "BRANCHES",
    "SkipNonFiniteState",
    "skip_nonfinite",
    "skipped_steps",
    "last_step_finite",
    "apply_if_finite_updates",
    "update_and_apply",
]


class SkipNonFiniteState(NamedTuple):
    skipped_steps: jax.Array  # int32: steps skipped since init, never reset
    last_finite: jax.Array  # bool: whether the latest gradients were finite
    inner_state: Any


def _negative_zero_like(x):
    zeros = jnp.zeros_like(x)
    return -zeros if jnp.issubdtype(zeros.dtype, jnp.inexact) else zeros


BRANCHES = ("select", "cond")


def _check_branch(branch: str) -> str:
    if branch not in BRANCHES:
        raise ValueError(f"branch must be one of {BRANCHES}, got {branch!r}.")
    return branch


def skip_nonfinite(inner, *, branch: str = "select") -> optax.GradientTransformationExtraArgs:
    """Wraps ``inner`` (a GradientTransformation or ``optax.MultiSteps``) to skip bad steps,
    branching by ``branch`` (``"select"`` or ``"cond"``, see the module doc)."""
    _check_branch(branch)
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

    def update(updates, state, params=None, *, grads_finite=None, **extra_args):
        # A caller that has checked the gradients already passes the verdict (a traced bool,
        # or a Python bool inside its own branch) instead of a second pass over them.
        finite = all_finite(updates) if grads_finite is None else grads_finite
        if finite is True or finite is False:
            return _decided_update(inner, finite, updates, state, params, extra_args)
        if branch == "cond":
            return _cond_update(inner, finite, updates, state, params, extra_args)
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


def _decided_update(inner, finite: bool, updates, state, params, extra_args):
    """The update once the verdict is known at trace time: a branch of a ``lax.cond``."""
    if finite:
        new_updates, new_inner = inner.update(updates, state.inner_state, params, **extra_args)
        return new_updates, SkipNonFiniteState(state.skipped_steps, jnp.asarray(True), new_inner)
    # -0.0 in the shapes and dtypes the inner update would return, so both branches match.
    shapes = jax.eval_shape(
        lambda: inner.update(updates, state.inner_state, params, **extra_args)[0]
    )
    zeros = jax.tree.map(lambda a: _negative_zero_like(jnp.zeros(a.shape, a.dtype)), shapes)
    return zeros, SkipNonFiniteState(state.skipped_steps + 1, jnp.asarray(False), state.inner_state)


def _cond_update(inner, finite, updates, state, params, extra_args):
    def branch(verdict):
        return lambda ops: _decided_update(inner, verdict, *ops, extra_args)

    return lax.cond(finite, branch(True), branch(False), (updates, state, params))


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


def update_and_apply(tx, grads, opt_state, params, finite, branch: str = "select"):
    """``tx.update`` then ``optax.apply_updates``, skipped where ``finite`` is False:
    ``(new_params, new_opt_state)``.

    ``tx`` is a ``skip_nonfinite`` transformation and ``finite`` the caller's
    ``all_finite(grads)``, handed over so the gradients are checked once. With ``"cond"``
    the optimizer update and the params update share one ``lax.cond``, where XLA fuses
    across them: SGD with momentum makes two passes over each parameter, where two
    conditionals made three (the momentum, the scaled update and the add).
    """
    if not isinstance(opt_state, SkipNonFiniteState):
        updates, opt_state = tx.update(grads, opt_state, params)
        return apply_if_finite_updates(params, updates, finite, branch), opt_state
    if _check_branch(branch) == "select":
        updates, opt_state = tx.update(grads, opt_state, params, grads_finite=finite)
        return apply_if_finite_updates(params, updates, finite, branch), opt_state

    def apply(operands):
        g, state, p = operands
        updates, new_state = tx.update(g, state, p, grads_finite=True)
        return optax.apply_updates(p, updates), new_state

    def skip(operands):
        g, state, p = operands
        return p, tx.update(g, state, p, grads_finite=False)[1]

    return lax.cond(finite, apply, skip, (grads, opt_state, params))


def apply_if_finite_updates(params, updates, finite, branch: str = "select"):
    """``optax.apply_updates`` where ``finite``, else the old params bit for bit."""
    if _check_branch(branch) == "cond":
        return lax.cond(
            finite, lambda o: optax.apply_updates(*o), lambda o: o[0], (params, updates)
        )
    new_params = optax.apply_updates(params, updates)
    return jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_params, params)
