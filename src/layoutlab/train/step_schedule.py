"""``StepSchedule``: how many optimizer steps a run takes, and when it evaluates and saves."""

from __future__ import annotations

import dataclasses

from layoutlab.data import Dataset, steps_per_epoch
from layoutlab.train.config import TrainConfig
from layoutlab.train.config_checks import INT32_MAX

__all__ = ["StepSchedule", "make_step_schedule"]


@dataclasses.dataclass(frozen=True)
class StepSchedule:
    """When a run steps, evaluates and saves: counts in optimizer steps, except
    ``steps_per_epoch`` (batches)."""

    steps_per_epoch: int
    total_steps: int
    eval_every: int
    checkpoint_every: int
    accum_steps: int

    def epoch(self, step: int) -> float:
        return round(step * self.accum_steps / self.steps_per_epoch, 3)


def make_step_schedule(config: TrainConfig, dataset: Dataset) -> StepSchedule:
    n_train = dataset.split("train")[0].shape[0]
    if config.batch_size > n_train:
        raise ValueError(
            f"batch_size={config.batch_size} is larger than the {n_train} training examples "
            f"of {dataset.name}; use a batch_size <= {n_train}."
        )
    spe = steps_per_epoch(dataset, "train", config.batch_size)
    per_epoch = spe // config.accum_steps
    if config.num_steps is not None:
        total = config.num_steps
    else:
        total = config.epochs * spe // config.accum_steps
        if total < 1:
            raise ValueError(
                f"epochs={config.epochs} of {spe} batches give no optimizer step with "
                f"accum_steps={config.accum_steps}; raise epochs or lower accum_steps."
            )
    if total * config.accum_steps > INT32_MAX:  # the train state counts batches in int32
        batches = total * config.accum_steps
        each = f" of {config.accum_steps} batches ({batches} batches)" if batches > total else ""
        raise ValueError(
            f"{total} optimizer steps{each} are more than the {INT32_MAX} (2**31 - 1) batches "
            "a run counts (its step counter is int32); use fewer --steps or --epochs."
        )
    eval_every = config.eval_every or max(1, per_epoch)
    return StepSchedule(
        steps_per_epoch=spe,
        total_steps=total,
        eval_every=eval_every,
        checkpoint_every=config.checkpoint_every or eval_every,
        accum_steps=config.accum_steps,
    )
