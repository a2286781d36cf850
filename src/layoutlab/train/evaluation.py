"""``evaluate``: loss and accuracy of a train state over a data set's whole test split (or its
validation split), and the host-side scalars (loss scale, skipped steps) that go into the
same record."""

from __future__ import annotations

import jax
import numpy as np

from layoutlab.data import Dataset, epoch_batches
from layoutlab.train.ema import ema_view
from layoutlab.train.sharding import Shardings, assemble, local_rows
from layoutlab.train.skip import skipped_steps
from layoutlab.train.spec import RunSpec
from layoutlab.train.state import TrainState

__all__ = [
    "PAD_LABEL",
    "eval_batches",
    "eval_split",
    "eval_sums",
    "evaluate",
    "evaluate_with_ema",
    "host_scalars",
    "jit_eval_step",
    "pad_rows",
    "record_metrics",
    "run_eval_batch",
]

# The label of a padding row: the eval step counts it nowhere (``train.steps.make_eval_step``).
PAD_LABEL = -1


def eval_batches(count: int, size: int, devices: int = 1) -> tuple[int, int]:
    """``(steps, batch)``: how ``evaluate`` splits ``count`` test images. The fewest batches
    of at most ``size`` rows (a multiple of ``devices``, as a data-parallel config's
    ``eval_batch_size`` is; another size is rounded up to one), all of one size, that size a
    multiple of ``devices``; the last batch's rows past ``count`` are padding, fewer than
    ``steps * devices`` of them. ``(0, 0)`` for no images.

    Equal batches make one program, sharded and on the eval plan, where a full-size split
    left a remainder of another shape: a second compile, XLA's convs, every row on every
    device (CIFAR-10's 10,000 at 512: 19 batches and 272 rows; here 20 of 500).
    """
    if count <= 0:
        return 0, 0
    steps = -(-count // size)
    batch = -(-count // steps)
    batch = -(-batch // devices) * devices
    # A size that is no multiple of devices (`evaluate --batch-size 7` on 4) rounds up: then
    # fewer batches may hold the split, and the loader, which cuts it at `batch`, makes that
    # many, so the last padded batch is the last the loader gives.
    return -(-count // batch), batch


def jit_eval_step(eval_step, spec: RunSpec, shard: Shardings):
    """``eval_step`` (``train.steps.make_eval_step``) jitted as every evaluation runs it: its
    sums replicated, compiled with the run's inference XLA options. The training loop and
    ``layoutlab evaluate`` both go through here, so their programs are one and their metrics
    equal to the bit."""
    return jax.jit(
        eval_step,
        out_shardings=shard.replicated,
        compiler_options=spec.compile_options("infer") or None,
    )


def eval_sums(
    eval_step, state, dataset: Dataset, spec: RunSpec, shard: Shardings, split: str = "test"
) -> dict:
    """The eval step's sums (``train.steps.make_eval_step``) over the whole ``split``
    (``"test"`` or ``"val"``), as NumPy values: every image counted once, in batches of one
    shape, each split over the devices. The batch is the test split's (``eval_batches``) for
    either split, so the validation split runs the program (and eval plan) the test split
    does."""
    labels = dataset.split(split)[1]
    count = labels.shape[0]
    size = run_eval_batch(dataset, spec, shard.num_devices)
    steps = -(-count // size)
    rows = local_rows(shard.batch, size)  # this process's rows of each batch
    batches = epoch_batches(
        dataset, split, size, layout=spec.config.layout, shuffle=False, drop_last=False, rows=rows
    )
    total = None
    for i, local in enumerate(batches):
        if i == steps - 1 and count % size:  # the loader gives every process all of it
            local = _padded(local, size, rows)
        out = jax.device_get(eval_step(state, *assemble(shard.batch, local, size)))
        total = out if total is None else {k: total[k] + out[k] for k in total}
    counted = int(total["count"])
    if counted != labels.size:  # padding counted, or rows lost: a silently wrong metric
        raise RuntimeError(f"evaluate counted {counted} {split} labels of {labels.size}.")
    return total


def record_metrics(sums: dict, split: str = "test") -> dict:
    """The record's ``test_loss`` and ``test_accuracy`` (``val_*`` for the validation split)
    from ``eval_sums``."""
    counted = int(sums["count"])
    return {
        f"{split}_loss": float(sums["loss_sum"]) / counted,
        f"{split}_accuracy": int(sums["correct"]) / counted,
    }


def evaluate(
    eval_step, state, dataset: Dataset, spec: RunSpec, shard: Shardings, split: str = "test"
) -> dict:
    """Loss and accuracy over the whole ``split`` (``eval_sums``), named for it."""
    return record_metrics(eval_sums(eval_step, state, dataset, spec, shard, split), split)


def eval_split(dataset: Dataset) -> str:
    """The split a run evaluates while it trains: ``"val"`` when the data set holds one
    (``val_fraction``), else ``"test"``."""
    return "test" if dataset.val_labels is None else "val"


def evaluate_with_ema(
    eval_step, state, dataset: Dataset, spec: RunSpec, shard: Shardings, split: str = "test"
) -> dict:
    """``evaluate``, and for a state with a moving average of its weights (``train.ema``) the
    average's figures beside them (``ema_test_loss``, ``ema_val_accuracy``, ...), on the same
    compiled eval step."""
    record = evaluate(eval_step, state, dataset, spec, shard, split)
    if state.ema is not None:
        ema = evaluate(eval_step, ema_view(state), dataset, spec, shard, split)
        record.update({f"ema_{name}": value for name, value in ema.items()})
    return record


def pad_rows(x: np.ndarray, size: int, fill=0) -> np.ndarray:
    """``x`` with rows of ``fill`` appended up to ``size`` rows; ``x`` itself when it has
    them (the last of ``eval_batches``' batches is the one that needs them)."""
    if x.shape[0] >= size:
        return x
    return np.concatenate([x, np.full((size - x.shape[0], *x.shape[1:]), fill, x.dtype)])


def _padded(batch: tuple[np.ndarray, np.ndarray], size: int, rows) -> tuple[np.ndarray, ...]:
    """``(images, labels)`` padded to ``size`` rows (zero images, ``PAD_LABEL`` labels), then
    this process's ``rows`` of them (all when None)."""
    images, labels = pad_rows(batch[0], size), pad_rows(batch[1], size, PAD_LABEL)
    if rows is None:
        return images, labels
    return tuple(np.concatenate([x[a:b] for a, b in rows]) for x in (images, labels))


def run_eval_batch(dataset: Dataset, spec: RunSpec, devices: int = 1) -> int | None:
    """The batch size ``evaluate`` runs every test image at on ``devices`` (``eval_batches``),
    which the eval plan is made for; None: no test images."""
    size = eval_batches(dataset.split("test")[1].shape[0], spec.eval_batch_size, devices)[1]
    return size or None


def host_scalars(state: TrainState) -> dict:
    return {
        "loss_scale": float(state.loss_scale.loss_scale),
        "skipped_steps": int(skipped_steps(state.opt_state)),
    }
