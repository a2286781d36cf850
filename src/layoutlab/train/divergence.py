"""Stopping a run whose training diverged, before it records or saves anything diverged.

A step with non-finite gradients is skipped (``train.skip``) and that is normal now and
then: a float16 run's dynamic loss scale starts too high and backs off by skipping. A run
whose loss has gone non-finite for good skips every step after, and would otherwise train
to its end and certify a diverged model. The loop stops it, with one ``error:`` line
(``DivergedError``, a ``ValueError``), when

- ``MAX_SKIPPED_IN_A_ROW`` batches in a row had non-finite gradients: a dynamic loss scale
  halves on each skip, from at most 2**24 down to its floor of 1 in 24 skips, so a run past
  twice that has nothing left to back off; or
- an evaluation's test loss is not finite: that step's record and checkpoint are not
  written.

Both read the metrics the loop has already fetched (no device sync of their own), and the
checks run before every checkpoint and record, which also fetch first. Every process of a
multi-process run fetches the same replicated metrics, so all of them stop at the same step.
"""

from __future__ import annotations

import math

__all__ = ["MAX_SKIPPED_IN_A_ROW", "DivergedError", "Divergence"]

MAX_SKIPPED_IN_A_ROW = 50


class DivergedError(ValueError):
    """The run's loss went non-finite and stayed so; the message names the fix."""


class Divergence:
    """Watches a run's fetched metrics; ``newest_checkpoint()`` is the run's newest saved
    step (None: none), for the message. ``loss_scaled``: the run scales its loss, so a too
    large static scale is a cause too."""

    def __init__(self, accum_steps: int, newest_checkpoint, *, loss_scaled: bool = False):
        self.accum = accum_steps
        self.newest_checkpoint = newest_checkpoint
        self.loss_scaled = loss_scaled
        self.in_a_row = 0
        self.first = 0  # the first skipped micro-step (from 1) of the current streak
        self.loss = math.nan

    def add(self, fetched: list[dict], end_micro: int) -> None:
        """``fetched``: the train step metrics of the micro-steps up to ``end_micro``
        (counted from 1); raises ``DivergedError`` once ``MAX_SKIPPED_IN_A_ROW`` in a row
        were skipped."""
        start = end_micro - len(fetched)
        for i, m in enumerate(fetched):
            if bool(m["grads_finite"]):
                self.in_a_row = 0
                continue
            if self.in_a_row == 0:
                self.first = start + i + 1
            self.in_a_row += 1
            self.loss = float(m["loss"])
        if self.in_a_row >= MAX_SKIPPED_IN_A_ROW:
            first, last = self._step(self.first), self._step(end_micro)
            raise DivergedError(
                f"training diverged: the gradients of the last {self.in_a_row} batches in a row "
                f"(steps {first}-{last}, train loss {self.loss:g}) were not finite, so each was "
                f"skipped; the run stopped at step {last} without saving it; "
                f"{self._kept()}. {self._fix()}"
            )

    def check_eval(self, record: dict) -> None:
        """Raises ``DivergedError`` when ``record``'s validation or test loss is not finite."""
        split = "val" if "val_loss" in record else "test"
        loss = record.get(f"{split}_loss")
        if loss is None or math.isfinite(loss):
            return
        name = "validation" if split == "val" else "test"
        raise DivergedError(
            f"training diverged: the {name} loss at step {record['step']} is {loss:g} (the "
            "model's outputs are no longer finite); the run stopped without recording or "
            f"saving step {record['step']}; {self._kept()}. {self._fix()}"
        )

    def _step(self, micro: int) -> int:
        return -(-micro // self.accum)

    def _kept(self) -> str:
        newest = self.newest_checkpoint()
        if newest is None:
            return "it has no checkpoint"
        return f"its newest checkpoint, step {newest}, is kept as it was"

    def _fix(self) -> str:
        causes = "a lower --lr (or weight_decay" + (", or loss scale)" if self.loss_scaled else ")")
        return (
            f"Start the run again in a new --workdir with {causes}: --resume keeps the "
            "run's learning rate."
        )
