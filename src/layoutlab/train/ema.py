"""An exponential moving average (EMA) of a run's weights, kept in the train state.

``TrainState.ema`` is an ``EmaState`` (None without ``ema_decay``): the parameters and the
model state as the train step leaves them, averaged. As timm's ``ModelEmaV2``, which
averages a module's buffers with its parameters, the float model state (BatchNorm's running
statistics) is averaged too, so the EMA model is evaluated with statistics of the weights it
averages; what is not a float (dropout RNG keys and counters) is the raw model's, copied.

The train step updates it once per optimizer step, after the update is applied: with
``accum_steps > 1`` on the micro-step that completes an optimizer step, and never on a skipped
(non-finite) step, which leaves it bit for bit (``optimizer_stepped``). It is one more part of
the one jitted step and of every checkpoint, so a resumed run continues it exactly. The EMA
leaves have their parameters' dtypes, shapes and shardings.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

__all__ = ["EmaState", "ema_view", "init_ema", "optimizer_stepped", "update_ema"]


class EmaState(NamedTuple):
    params: Any  # nnx.State, as TrainState.params
    model_state: Any  # nnx.State, as TrainState.model_state


def init_ema(params, model_state) -> EmaState:
    """The EMA at the start: a copy of the initial weights (timm's ``ModelEmaV2`` starts from
    the model's)."""
    return EmaState(jax.tree.map(jnp.copy, params), jax.tree.map(jnp.copy, model_state))


def _is_float(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def optimizer_stepped(old_opt_state, new_opt_state, finite) -> jax.Array:
    """Whether the micro-step from ``old_opt_state`` to ``new_opt_state`` (a
    ``skip_nonfinite`` state, ``train.optim.build_optimizer``'s) applied an optimizer update:
    under ``optax.MultiSteps`` when its count of updates moved (a skipped micro-step keeps the
    whole inner state), else when the gradients were ``finite``."""
    is_multi = lambda x: isinstance(x, optax.MultiStepsState)
    old = [s for s in jax.tree.leaves(old_opt_state, is_leaf=is_multi) if is_multi(s)]
    new = [s for s in jax.tree.leaves(new_opt_state, is_leaf=is_multi) if is_multi(s)]
    if len(old) == 1 and len(new) == 1:
        return new[0].gradient_step != old[0].gradient_step
    return jnp.asarray(finite)


def update_ema(ema: EmaState, params, model_state, decay: float, stepped) -> EmaState:
    """``decay * ema + (1 - decay) * new`` where ``stepped`` (a traced bool), else ``ema``
    unchanged; non-float leaves are the new ones."""

    def average(new, old):
        if not _is_float(new):
            return new
        mixed = optax.incremental_update(new, old, step_size=1.0 - decay)
        return jnp.where(stepped, mixed.astype(old.dtype), old)

    return EmaState(
        jax.tree.map(average, params, ema.params),
        jax.tree.map(average, model_state, ema.model_state),
    )


def ema_view(state):
    """``state`` (a ``TrainState`` with an EMA) with the EMA's params and model state in place
    of the raw ones: what the eval step evaluates for the EMA metrics. The pytree's structure,
    shapes and shardings are ``state``'s, so the compiled eval step serves both."""
    return state._replace(params=state.ema.params, model_state=state.ema.model_state)
