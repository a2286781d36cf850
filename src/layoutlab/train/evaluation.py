"""``evaluate``: loss and accuracy of a train state over a data set's whole test split, and
the host-side scalars (loss scale, skipped steps) that go into the same record."""

from __future__ import annotations

import jax

from layoutlab.data import Dataset, epoch_batches
from layoutlab.train.config import TrainConfig
from layoutlab.train.sharding import Shardings, assemble, local_rows
from layoutlab.train.skip import skipped_steps
from layoutlab.train.state import TrainState

__all__ = ["evaluate", "host_scalars", "main_eval_batch"]


def evaluate(eval_step, state, dataset: Dataset, config: TrainConfig, shard: Shardings) -> dict:
    """Loss and accuracy over the whole test split, the last partial batch included.

    Full batches are split over the devices; the remainder (any size) runs replicated, which
    costs one more compile of the eval step and keeps every example counted once.
    """
    total, size = None, config.eval_batch_size
    full_batches = dataset.split("test")[1].shape[0] // size
    batches = epoch_batches(
        dataset,
        "test",
        size,
        layout=config.layout,
        shuffle=False,
        drop_last=False,
        rows=local_rows(shard.batch, size),  # this process's rows of each full batch
    )
    for i, local in enumerate(batches):
        if i < full_batches:
            batch = assemble(shard.batch, local, size)
        else:  # every process holds the whole remainder
            batch = assemble(shard.replicated, local, local[1].shape[0])
        out = jax.device_get(eval_step(state, *batch))
        total = out if total is None else {k: total[k] + out[k] for k in total}
    count = int(total["count"])
    return {
        "test_loss": float(total["loss_sum"]) / count,
        "test_accuracy": int(total["correct"]) / count,
    }


def main_eval_batch(dataset: Dataset, config: TrainConfig) -> int | None:
    """The batch size ``evaluate`` runs most test images at: the eval batch size when the
    test split fills one, else the split's size (its one partial batch); None: no test
    images."""
    count = dataset.split("test")[1].shape[0]
    if count == 0:
        return None
    return config.eval_batch_size if count >= config.eval_batch_size else count


def host_scalars(state: TrainState) -> dict:
    return {
        "loss_scale": float(state.loss_scale.loss_scale),
        "skipped_steps": int(skipped_steps(state.opt_state)),
    }
