"""The optimizer and learning-rate schedule a ``TrainConfig`` names.

``optimizer_spec(config, total_steps, policy)`` resolves them to an ``OptimizerSpec`` (a
frozen value, part of ``train.spec.RunSpec``) and ``build_optimizer`` makes the optax
transformation from it; ``make_optimizer``/``make_schedule`` do both for a config.

Wrap order (see ``layoutlab.train.skip``): ``skip_nonfinite(MultiSteps(chain(...), k))``, so a
micro-step with non-finite gradients leaves the accumulator untouched.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from layoutlab.precision import Policy, get_policy
from layoutlab.train.config import TrainConfig
from layoutlab.train.skip import skip_nonfinite

__all__ = [
    "OptimizerSpec",
    "build_optimizer",
    "build_schedule",
    "decay_mask",
    "float32_state",
    "make_optimizer",
    "make_schedule",
    "optimizer_spec",
    "warmup_steps",
]


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """Everything the optimizer of a run is made from, resolved: ``build_optimizer`` makes
    ``skip_nonfinite(MultiSteps(float32_state(optimizer), accum_steps))`` of it."""

    name: str  # one of config.OPTIMIZERS
    learning_rate: float
    momentum: float
    weight_decay: float
    schedule: str  # "constant" or "cosine"
    warmup_steps: int
    total_steps: int  # optimizer steps the schedule spans
    accum_steps: int
    float32_state: bool  # half-precision params: the optimizer state is kept in float32

    @property
    def label(self) -> str:
        """One line for reports and result rows, e.g. ``adamw(lr=0.003, wd=0.0001, cosine
        over 1000 steps, warmup 50)``."""
        parts = [f"lr={self.learning_rate:g}"]
        if self.name == "momentum":
            parts.append(f"momentum={self.momentum:g}")
        if self.weight_decay:
            parts.append(f"wd={self.weight_decay:g}")
        parts.append(f"{self.schedule} over {self.total_steps} steps")
        if self.warmup_steps:
            parts.append(f"warmup {self.warmup_steps}")
        if self.accum_steps > 1:
            parts.append(f"accumulating {self.accum_steps}")
        if self.float32_state:
            parts.append("float32 state")
        return f"{self.name}({', '.join(parts)})"


def optimizer_spec(
    config: TrainConfig, total_steps: int, policy: Policy | None = None
) -> OptimizerSpec:
    """The ``OptimizerSpec`` of ``config`` over ``total_steps`` optimizer steps; ``policy``:
    the run's (resolved from ``config.precision`` when not given)."""
    policy = get_policy(config.precision) if policy is None else policy
    return OptimizerSpec(
        name=config.optimizer,
        learning_rate=config.learning_rate,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
        schedule=config.schedule,
        warmup_steps=warmup_steps(config, total_steps),
        total_steps=total_steps,
        accum_steps=config.accum_steps,
        float32_state=policy.param_dtype.itemsize < 4,
    )


def warmup_steps(config: TrainConfig, total_steps: int) -> int:
    """The configured warmup, or 5% of the optimizer steps; never the whole run."""
    steps = config.warmup_steps
    if steps is None:
        steps = round(0.05 * total_steps)
    return min(steps, max(total_steps - 1, 0))


def make_schedule(config: TrainConfig, total_steps: int) -> optax.Schedule:
    """Linear warmup from 0, then constant or cosine decay to 0 at ``total_steps``."""
    return build_schedule(optimizer_spec(config, total_steps))


def build_schedule(spec: OptimizerSpec) -> optax.Schedule:
    """The learning rate of ``spec`` by optimizer step."""
    warmup, lr, total_steps = spec.warmup_steps, spec.learning_rate, spec.total_steps
    if spec.schedule == "cosine":
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


def _inner(spec: OptimizerSpec, schedule) -> optax.GradientTransformation:
    wd = spec.weight_decay
    if spec.name == "adamw":
        return optax.adamw(schedule, weight_decay=wd, mask=decay_mask)
    if spec.name == "adam":
        base = optax.adam(schedule)
    elif spec.name == "momentum":
        base = optax.sgd(schedule, momentum=spec.momentum)
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
    """``build_optimizer(optimizer_spec(config, total_steps))``; ``total_steps`` counts
    updates."""
    return build_optimizer(optimizer_spec(config, total_steps))


def build_optimizer(
    spec: OptimizerSpec, skip_branch: str = "select", frozen=None
) -> optax.GradientTransformation:
    """``skip_nonfinite(MultiSteps(optimizer, accum_steps), branch=skip_branch)``; with
    half-precision params (``spec.float32_state``) the optimizer is wrapped in
    ``float32_state``; ``frozen(optimizer)``: the optimizer of a frozen backbone
    (``train.freeze.frozen_updates``)."""
    inner = _inner(spec, build_schedule(spec))
    if frozen is not None:
        inner = frozen(inner)
    if spec.float32_state:
        inner = float32_state(inner)
    if spec.accum_steps > 1:
        inner = optax.MultiSteps(inner, every_k_schedule=spec.accum_steps)
    return skip_nonfinite(inner, branch=skip_branch)
