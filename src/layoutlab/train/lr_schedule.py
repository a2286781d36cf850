"""The learning-rate schedule of a run: a linear warmup from ``min_lr``, then constant, cosine
(down to ``min_lr``) or step decay (by ``lr_decay_rate`` at ``lr_decay_epochs``, never below
``min_lr``), built from optax's schedules.

Epoch counts (``warmup_epochs``, ``lr_decay_epochs``) become optimizer steps with the run's
optimizer steps per epoch (``schedule_steps``); ``check_run_steps`` refuses what does not fit
in the run (a warmup as long as the run, a decay at or past its end or inside the warmup).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax.numpy as jnp
import optax

if TYPE_CHECKING:
    from layoutlab.train.config import TrainConfig

__all__ = ["build_schedule", "check_run_steps", "schedule_line", "schedule_steps"]


def _per_epoch(config: TrainConfig, total_steps: int, steps_per_epoch: float | None) -> float:
    # Without the data set (bench, inspect, infer: no schedule runs) an epoch is the run's
    # share of its steps.
    return total_steps / config.epochs if steps_per_epoch is None else steps_per_epoch


def _warmup(config: TrainConfig, total_steps: int, per_epoch: float) -> int:
    if config.warmup_epochs is not None:
        return round(config.warmup_epochs * per_epoch)
    if config.warmup_steps is not None:
        return config.warmup_steps
    return round(0.05 * total_steps)


def schedule_steps(
    config: TrainConfig, total_steps: int, steps_per_epoch: float | None = None
) -> tuple[int, tuple[int, ...]]:
    """``(warmup steps, decay steps)`` of ``config`` over ``total_steps`` optimizer steps, at
    ``steps_per_epoch`` optimizer steps per epoch; the warmup is never the whole run (the
    default warmup is 5% of the steps)."""
    per_epoch = _per_epoch(config, total_steps, steps_per_epoch)
    warmup = min(_warmup(config, total_steps, per_epoch), max(total_steps - 1, 0))
    decays = tuple(round(e * per_epoch) for e in config.lr_decay_epochs or ())
    return warmup, decays if config.schedule == "step" else ()


def check_run_steps(config: TrainConfig, total_steps: int, steps_per_epoch: float) -> None:
    """Raises ``ValueError`` naming the fix where ``config``'s warmup or decay epochs do not
    fit in a run of ``total_steps`` optimizer steps of ``steps_per_epoch`` per epoch."""
    warmup = _warmup(config, total_steps, steps_per_epoch)
    given = config.warmup_epochs is not None or config.warmup_steps is not None
    if given and warmup >= total_steps:
        asked = (
            f"warmup_epochs={config.warmup_epochs:g} ({warmup} optimizer steps)"
            if config.warmup_epochs is not None
            else f"warmup_steps={warmup}"
        )
        raise ValueError(
            f"{asked} is as long as the whole run ({total_steps} optimizer steps); use a "
            f"warmup shorter than the run, or train longer."
        )
    run_epochs = total_steps / steps_per_epoch
    previous = None
    decay_epochs = (config.lr_decay_epochs or ()) if config.schedule == "step" else ()
    for epoch in decay_epochs:
        step = round(epoch * steps_per_epoch)
        if step >= total_steps:
            raise ValueError(
                f"lr_decay_epochs: epoch {epoch:g} (optimizer step {step}) is at or past the "
                f"end of the run ({total_steps} steps, {run_epochs:g} epochs); drop it or "
                "train longer."
            )
        if step <= warmup:
            raise ValueError(
                f"lr_decay_epochs: epoch {epoch:g} (optimizer step {step}) is inside the "
                f"warmup ({warmup} steps); decay after the warmup, or shorten it."
            )
        if step == previous:
            raise ValueError(
                f"lr_decay_epochs: epoch {epoch:g} falls on optimizer step {step}, as the one "
                "before it does; space the epochs at least one optimizer step apart."
            )
        previous = step


def build_schedule(spec) -> optax.Schedule:
    """The learning rate of ``spec`` (a ``train.optim.OptimizerSpec``, which imports this
    module) by optimizer count (0 for the first update)."""
    warmup, lr, floor = spec.warmup_steps, spec.learning_rate, spec.min_lr
    if spec.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            floor, lr, warmup_steps=warmup, decay_steps=max(spec.total_steps, 1), end_value=floor
        )
    if spec.schedule == "step":
        # join_schedules hands the schedule after the warmup its count from the warmup's end.
        decay = optax.piecewise_constant_schedule(
            lr, {step - warmup: spec.decay_rate for step in spec.decay_steps}
        )

        def main(count):
            return jnp.maximum(decay(count), floor)

    else:
        main = optax.constant_schedule(lr)
    if warmup == 0:
        return main
    return optax.join_schedules([optax.linear_schedule(floor, lr, warmup), main], [warmup])


def _epochs(value: float) -> str:
    return f"{value:g} epoch{'' if value == 1 else 's'}"


def schedule_line(spec) -> str:
    """What the schedule will run, in one line, e.g. ``cosine 0.003 -> 1e-05 over 1560
    steps, warmup 78 steps (1 epoch)``."""
    lr, floor = spec.learning_rate, spec.min_lr
    text = {"cosine": f"cosine {lr:g} -> {floor:g}"}.get(spec.schedule, f"{spec.schedule} {lr:g}")
    if spec.schedule == "step":
        text += f" x{spec.decay_rate:g} at steps {','.join(map(str, spec.decay_steps))}"
        if spec.steps_per_epoch:
            epochs = ",".join(f"{s / spec.steps_per_epoch:g}" for s in spec.decay_steps)
            text += f" (epochs {epochs})"
    text += f" over {spec.total_steps} steps"
    if spec.schedule == "step" and floor:
        text += f", floor {floor:g}"
    if spec.warmup_steps:
        text += f", warmup {spec.warmup_steps} steps from {floor:g}"
        if spec.warmup_epochs is not None:
            text += f" ({_epochs(spec.warmup_epochs)})"
    return text
