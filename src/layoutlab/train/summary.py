"""``summary.json``: a finished run in one file, written atomically when it finishes (a resumed
run's end writes it again): its id, model and data, the step and epoch it ended at, the best
evaluation (``keep_best``), the final record's metrics, the test metrics at the end, its
wall time and train images per second, and whether it stopped early.

``layoutlab runs`` (``infer.runs``) reads these files back.
"""

from __future__ import annotations

import math

from layoutlab.train.metrics import write_json

__all__ = ["SUMMARY_FILE", "SUMMARY_KEYS", "run_summary", "write_summary"]

SUMMARY_FILE = "summary.json"
SUMMARY_KEYS = (
    "run_id",
    "model",
    "data",
    "step",
    "total_steps",
    "epoch",
    "best",
    "final",
    "test",
    "wall_time_s",
    "images_per_sec",
    "stopped_early",
    "stop_reason",
)
_FINAL = ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "test_loss", "test_accuracy")


def _plain(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN
    return value


def run_summary(
    config,
    record: dict,
    *,
    total_steps: int,
    best: dict | None,
    wall_time_s: float | None,
    images_per_sec: float | None,
    stop_reason: str | None,
) -> dict:
    """The summary of a run (``config``: its resolved ``TrainConfig``) whose last eval
    record is ``record``; ``best``: ``train.best.Best.to_dict()`` (None without keep_best)."""
    summary = {
        "run_id": config.run_id,
        "model": config.model,
        "data": config.data,
        "step": record["step"],
        "total_steps": total_steps,
        "epoch": record.get("epoch"),
        "best": best,
        "final": {k: _plain(record[k]) for k in _FINAL if k in record},
        "test": {k: _plain(record.get(k)) for k in ("test_loss", "test_accuracy")},
        "wall_time_s": wall_time_s,
        "images_per_sec": _plain(images_per_sec),
        "stopped_early": stop_reason is not None,
        "stop_reason": stop_reason,
    }
    return summary


def write_summary(path, summary: dict) -> None:
    write_json(path, summary)
