"""A run's best checkpoint and early stop (``keep_best``, ``early_stop``), and what it writes
when it finishes (``summary.json``).

The best checkpoint is ``<workdir>/best/<step>``, a ``train.checkpoint.Checkpointer`` of its
own keeping one step: a better evaluation is saved there by the same commit order as every
checkpoint (orbax's atomic save, the CRC manifest checked, only then the previous best
removed), so a kill during that save leaves the previous best, or the new one, readable. It
is saved before the step's regular checkpoint, which carries the best so far
(``extra["best"]``): a resume from that checkpoint keeps comparing with the right best and
counting toward ``early_stop`` from where it was.
"""

from __future__ import annotations

import time
from pathlib import Path

from layoutlab.train.best import BEST_DIR, Best, parse_metric
from layoutlab.train.checkpoint import Checkpointer
from layoutlab.train.summary import SUMMARY_FILE, run_summary, write_summary

__all__ = ["BestKeeper", "finish_run"]

_BEST_KEY = "best"  # checkpoint extra: Best.to_dict()


class BestKeeper:
    """``keep_best``'s checkpoint and ``early_stop``'s count for one run; with neither, a
    keeper that keeps nothing and never stops."""

    def __init__(self, best: Best | None, ckpt: Checkpointer | None, patience: int | None):
        self.best, self.ckpt, self.patience = best, ckpt, patience

    @classmethod
    def open(cls, config, workdir: Path) -> BestKeeper:
        """The keeper of ``config`` (a resolved run's, its ``run_id`` set) in ``workdir``."""
        if config.keep_best is None:
            return cls(None, None, None)
        metric = parse_metric(config.keep_best, validation=config.val_fraction > 0)
        ckpt = Checkpointer(
            Path(workdir) / BEST_DIR, max_to_keep=1, run_id=config.run_id, barrier_prefix=BEST_DIR
        )
        return cls(Best(metric), ckpt, config.early_stop)

    def restore(self, extra: dict) -> None:
        """The best so far as the checkpoint a run resumes from saved it."""
        if self.best is not None:
            self.best = Best.from_dict(self.best.metric, extra.get(_BEST_KEY))

    def evaluated(self, record: dict, state, extra: dict) -> bool:
        """Takes the eval ``record`` of ``state``: saves ``state`` as the best checkpoint when
        it is better than any before (with ``extra``); True when ``early_stop`` ends the run."""
        if self.best is None:
            return False
        if self.best.update(record):
            self.ckpt.save(record["step"], state, {**extra, **self.extra()})
        return self.stops()

    def stops(self) -> bool:
        return self.best is not None and self.best.stops(self.patience)

    def stop_reason(self) -> str | None:
        """The one line saying why the run stopped early; None while it does not."""
        if not self.stops():
            return None
        b = self.best
        return (
            f"early stop: {b.metric.name} has not improved on {b.value:.4f} (step {b.step}) "
            f"in {b.stale} evaluations (early_stop={self.patience})"
        )

    def extra(self) -> dict:
        """What every checkpoint carries of it."""
        return {} if self.best is None else {_BEST_KEY: self.best.to_dict()}

    def close(self) -> None:
        if self.ckpt is not None:
            self.ckpt.close()


def finish_run(
    workdir: Path, config, record: dict, total_steps: int, keeper: BestKeeper,
    start: float | None = None, trained: tuple[int, float] | None = None,
) -> None:  # fmt: skip
    """Writes the finished run's ``summary.json`` (atomically); ``start``: when this process's
    run began (``time.perf_counter``), ``trained``: the images and seconds it trained. Without
    them (a resume that found the run complete) the file is written only where it is missing,
    its time and speed unknown (null)."""
    path = Path(workdir) / SUMMARY_FILE
    if start is None and path.exists():
        return
    images, seconds = trained or (0, 0.0)
    summary = run_summary(
        config,
        record,
        total_steps=total_steps,
        best=None if keeper.best is None else keeper.best.to_dict(),
        wall_time_s=None if start is None else round(time.perf_counter() - start, 3),
        images_per_sec=images / seconds if seconds > 0 else None,
        stop_reason=keeper.stop_reason(),
    )
    write_summary(path, summary)
