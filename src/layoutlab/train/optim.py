"""The optimizer and learning-rate schedule a ``TrainConfig`` names.

Wrap order (see ``layoutlab.train.skip``): ``skip_nonfinite(MultiSteps(chain(...), k))``, so a
micro-step with non-finite gradients leaves the accumulator untouched.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from layoutlab.precision import get_policy
from layoutlab.train.config import TrainConfig
from layoutlab.train.skip import skip_nonfinite

__all__ = ["decay_mask", "float32_state", "make_optimizer", "make_schedule", "warmup_steps"]


def warmup_steps(config: TrainConfig, total_steps: int) -> int:
    """The configured warmup, or 5% of the optimizer steps; never the whole run."""
    steps = config.warmup_steps
    if steps is None:
        steps = round(0.05 * total_steps)
    return min(steps, max(total_steps - 1, 0))


def make_schedule(config: TrainConfig, total_steps: int) -> optax.Schedule:
    """Linear warmup from 0, then constant or cosine decay to 0 at ``total_steps``."""
    warmup = warmup_steps(config, total_steps)
    lr = config.learning_rate
    if config.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            0.0, lr, warmup_steps=warmup, decay_steps=max(total_steps, 1), end_value=0.0
        )
    if warmup == 0:
        return optax.constant_schedule(lr)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, lr, warmup), optax.constant_schedule(lr)], [warmup]
    )


def decay_mask(params):
    """Weight decay on kernels only: biases and norm scales (rank <= 1) are not decayed."""
    return jax.tree.map(lambda p: p.ndim > 1, params)


def _inner(config: TrainConfig, schedule) -> optax.GradientTransformation:
    wd = config.weight_decay
    if config.optimizer == "adamw":
        return optax.adamw(schedule, weight_decay=wd, mask=decay_mask)
    if config.optimizer == "adam":
        base = optax.adam(schedule)
    elif config.optimizer == "momentum":
        base = optax.sgd(schedule, momentum=config.momentum)
    else:
        base = optax.sgd(schedule)
    if wd == 0:
        return base
    # L2 added to the gradient, as torch.optim.SGD/Adam's weight_decay does.
    return optax.chain(optax.add_decayed_weights(wd, mask=decay_mask), base)


def _to_f32(tree):
    return jax.tree.map(lambda x: x.astype(jnp.float32), tree)


def float32_state(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """Runs ``inner`` in float32 for half-precision params; updates come back in their dtype.

    Adam's ``eps=1e-8`` and its squared gradients underflow float16 (0 / 0 = NaN updates
    from finite gradients), so pure-half policies keep the optimizer state in float32.
    """

    inner = optax.with_extra_args_support(inner)

    def init(params):
        return inner.init(_to_f32(params))

    def update(updates, state, params=None, **extra_args):
        # extra_args (optax's value, loss, ...) go through as optax.chain forwards them.
        new, state = inner.update(
            _to_f32(updates), state, None if params is None else _to_f32(params), **extra_args
        )
        return jax.tree.map(lambda u, g: u.astype(g.dtype), new, updates), state

    return optax.GradientTransformationExtraArgs(init, update)


def make_optimizer(config: TrainConfig, total_steps: int) -> optax.GradientTransformation:
    """``skip_nonfinite(MultiSteps(optimizer, accum_steps))``; ``total_steps`` counts updates.

    With half-precision params the optimizer is wrapped in ``float32_state``.
    """
    inner = _inner(config, make_schedule(config, total_steps))
    if get_policy(config.precision).param_dtype.itemsize < 4:
        inner = float32_state(inner)
    if config.accum_steps > 1:
        inner = optax.MultiSteps(inner, every_k_schedule=config.accum_steps)
    return skip_nonfinite(inner)
