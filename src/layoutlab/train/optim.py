"""The optimizer and learning-rate schedule a ``TrainConfig`` names.

``optimizer_spec(config, total_steps, policy)`` resolves them to an ``OptimizerSpec`` (a
frozen value, part of ``train.spec.RunSpec``) and ``build_optimizer`` makes the optax
transformation from it; ``make_optimizer``/``make_schedule`` do both for a config.

Wrap order (see ``layoutlab.train.skip``): ``skip_nonfinite(MultiSteps(chain(...), k))``, so a
micro-step with non-finite gradients leaves the accumulator untouched. ``clip_grad_norm`` is the
first link of the chain: it sees the accumulated (full-batch), unscaled gradient of an
optimizer step, never a micro-batch's.

The schedule itself is ``train.lr_schedule``'s.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from layoutlab.precision import Policy, get_policy
from layoutlab.train.config import TrainConfig
from layoutlab.train.lr_schedule import build_schedule, schedule_line, schedule_steps
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
    min_lr: float = 0.0  # the schedule's floor (train.lr_schedule)
    decay_steps: tuple[int, ...] = ()  # "step": the optimizer counts at which it decays
    decay_rate: float = 0.1
    clip_grad_norm: float | None = None  # the accumulated gradient's global L2 norm at most
    warmup_epochs: float | None = None  # as asked (the label says it); warmup_steps runs
    steps_per_epoch: float | None = None  # optimizer steps per epoch, when the data is known

    @property
    def schedule_line(self) -> str:
        """The schedule in one line (``train.lr_schedule.schedule_line``)."""
        return schedule_line(self)

    @property
    def label(self) -> str:
        """One line for reports and result rows, e.g. ``adamw(lr=0.003, wd=0.0001, cosine
        over 1000 steps, warmup 50)``."""
        parts = [f"lr={self.learning_rate:g}"]
        if self.name == "momentum":
            parts.append(f"momentum={self.momentum:g}")
        if self.weight_decay:
            parts.append(f"wd={self.weight_decay:g}")
        if self.min_lr or self.schedule == "step":
            parts.append(self.schedule_line)  # what the short form below leaves out
        else:
            parts.append(f"{self.schedule} over {self.total_steps} steps")
            if self.warmup_steps:
                parts.append(f"warmup {self.warmup_steps}")
        if self.clip_grad_norm is not None:
            parts.append(f"clip {self.clip_grad_norm:g}")
        if self.accum_steps > 1:
            parts.append(f"accumulating {self.accum_steps}")
        if self.float32_state:
            parts.append("float32 state")
        return f"{self.name}({', '.join(parts)})"


def optimizer_spec(
    config: TrainConfig,
    total_steps: int,
    policy: Policy | None = None,
    steps_per_epoch: float | None = None,
) -> OptimizerSpec:
    """The ``OptimizerSpec`` of ``config`` over ``total_steps`` optimizer steps; ``policy``:
    the run's (resolved from ``config.precision`` when not given); ``steps_per_epoch``: the
    run's optimizer steps per epoch, which epoch counts are converted with (None: the steps
    over ``config.epochs``)."""
    policy = get_policy(config.precision) if policy is None else policy
    warmup, decays = schedule_steps(config, total_steps, steps_per_epoch)
    return OptimizerSpec(
        name=config.optimizer,
        learning_rate=config.learning_rate,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
        schedule=config.schedule,
        warmup_steps=warmup,
        total_steps=total_steps,
        accum_steps=config.accum_steps,
        float32_state=policy.param_dtype.itemsize < 4,
        min_lr=config.min_lr,
        decay_steps=decays,
        decay_rate=config.lr_decay_rate,
        clip_grad_norm=config.clip_grad_norm,
        warmup_epochs=config.warmup_epochs,
        steps_per_epoch=steps_per_epoch,
    )


def warmup_steps(config: TrainConfig, total_steps: int) -> int:
    """The configured warmup, or 5% of the optimizer steps; never the whole run."""
    return schedule_steps(config, total_steps)[0]


def make_schedule(
    config: TrainConfig, total_steps: int, steps_per_epoch: float | None = None
) -> optax.Schedule:
    """Linear warmup from ``min_lr``, then constant, cosine decay to ``min_lr`` at
    ``total_steps`` or step decay (``train.lr_schedule.build_schedule``)."""
    return build_schedule(optimizer_spec(config, total_steps, steps_per_epoch=steps_per_epoch))


def decay_mask(params):
    """Weight decay on kernels only: biases and norm scales (rank <= 1) are not decayed."""
    return jax.tree.map(lambda p: p.ndim > 1, params)


def _inner(spec: OptimizerSpec, schedule) -> optax.GradientTransformation:
    base = _update_rule(spec, schedule)
    if spec.clip_grad_norm is None:
        return base
    # First, so weight decay added to the gradient (sgd, adam) is not clipped, as in
    # torch, where clip_grad_norm_ runs before optimizer.step adds it.
    return optax.chain(optax.clip_by_global_norm(spec.clip_grad_norm), base)


def _update_rule(spec: OptimizerSpec, schedule) -> optax.GradientTransformation:
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
