"""Per-step training metrics: ``steps.jsonl`` and TensorBoard event files in the workdir.

The loop hands over metrics it has already fetched for its progress bar (every few steps and
at every evaluation), so logging adds no device synchronisation. Every ``log_every``-th
optimizer step is written: the mean loss and accuracy of its micro-batches, the loss scale
it ran with and its learning rate. TensorBoard files are written with tensorboardX, which
needs no TensorFlow; read them with ``tensorboard --logdir WORKDIR/tensorboard``.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import jax
import numpy as np

from layoutlab.train.metrics import append_record, truncate_records
from layoutlab.train.optim import build_schedule

__all__ = ["STEPS_FILE", "TENSORBOARD_DIR", "StepLog"]

STEPS_FILE = "steps.jsonl"
TENSORBOARD_DIR = "tensorboard"
# Evaluation record keys shown in TensorBoard, under these tags.
_EVAL_TAGS = {
    "val_loss": "val/loss",
    "val_accuracy": "val/accuracy",
    "test_loss": "test/loss",
    "test_accuracy": "test/accuracy",
    "train_loss": "train_epoch/loss",
    "train_accuracy": "train_epoch/accuracy",
    "images_per_sec": "speed/images_per_sec",
}


def _summary_writer():
    """tensorboardX's ``SummaryWriter``, imported without PyTorch where PyTorch is not loaded
    yet: tensorboardX imports torch only to accept torch tensors (a run logs floats), and that
    import takes more CPU time than starting a short run. A run without TensorBoard never
    imports tensorboardX."""
    if "torch" in sys.modules or "tensorboardX" in sys.modules:
        from tensorboardX import SummaryWriter

        return SummaryWriter
    sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX expects
    try:
        from tensorboardX import SummaryWriter
    except ImportError:  # a tensorboardX that needs torch after all: import it with torch
        for name in [m for m in sys.modules if m.split(".")[0] == "tensorboardX"]:
            del sys.modules[name]
        del sys.modules["torch"]
        from tensorboardX import SummaryWriter
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return SummaryWriter


class StepLog:
    """Writes per-step metrics of steps ``start + 1 ..``; ``every=0`` writes none.

    ``learning_rate(count)`` maps an optimizer count to its rate (the optax schedule). It runs
    jitted at one int32 scalar, as the optimizer runs it: one program for every flush, where an
    eager call compiled each primitive again for each new number of rows
    (docs/development.md). On resume, records and events after ``start`` are dropped first, so
    a resumed run shows each step once.
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        *,
        every: int,
        tensorboard: bool,
        start: int,
        accum_steps: int,
        learning_rate=None,
        enabled: bool = True,
    ):
        self.every = every if enabled else 0
        self.accum = accum_steps
        self.learning_rate = None if learning_rate is None else jax.jit(learning_rate)
        self.path = Path(workdir) / STEPS_FILE
        self.writer = None
        if not enabled:
            return
        truncate_records(self.path, start)
        if tensorboard:
            # purge_step: TensorBoard hides events at or after it from earlier runs in the dir.
            self.writer = _summary_writer()(
                os.fspath(Path(workdir) / TENSORBOARD_DIR), purge_step=start + 1, flush_secs=30
            )

    @classmethod
    def for_run(cls, workdir, spec, schedule, start: int, *, enabled: bool) -> StepLog:
        """The log of a ``RunSpec`` run (its config's ``log_every`` and ``tensorboard``)
        resumed at ``start``; ``enabled=False`` on processes other than 0, which write
        nothing."""
        return cls(
            workdir,
            every=spec.config.log_every,
            tensorboard=spec.config.tensorboard,
            start=start,
            accum_steps=schedule.accum_steps,
            learning_rate=build_schedule(spec.optimizer),
            enabled=enabled,
        )

    def add(self, fetched: list[dict], end_micro: int) -> None:
        """``fetched``: host metrics of consecutive micro-steps ending at micro-step
        ``end_micro`` (counted from 1); they cover whole optimizer steps."""
        if not self.every or not fetched:
            return
        first = end_micro - len(fetched)
        rows = []
        for i in range(0, len(fetched), self.accum):
            step = (first + i) // self.accum + 1
            if step % self.every:
                continue
            group = fetched[i : i + self.accum]
            rows.append(
                {
                    "step": step,
                    "loss": float(np.mean([m["loss"] for m in group], dtype=np.float64)),
                    "accuracy": float(np.mean([m["accuracy"] for m in group], dtype=np.float64)),
                    "loss_scale": float(group[-1]["loss_scale"]),
                }
            )
        if rows and self.learning_rate is not None:
            # The update of step s used the schedule at optimizer count s - 1.
            with jax.numpy_dtype_promotion("standard"):  # as the optimizer evaluates it
                for row in rows:
                    row["learning_rate"] = float(self.learning_rate(np.int32(row["step"] - 1)))
        for row in rows:
            append_record(self.path, row)
            if self.writer is not None:
                for key, value in row.items():
                    if key != "step" and math.isfinite(value):
                        self.writer.add_scalar(f"train/{key}", value, row["step"])

    def add_eval(self, record: dict) -> None:
        if self.writer is None:
            return
        for key, tag in _EVAL_TAGS.items():
            value = record.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(tag, value, record["step"])
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
