"""Run outputs in the workdir: ``config.json`` and ``metrics.jsonl`` (one JSON object per eval).

Every record has ``step``, ``epoch``, ``train_loss``, ``train_accuracy``, ``test_loss``,
``test_accuracy``, ``images_per_sec``, ``loss_scale``, ``skipped_steps`` and ``elapsed``; with
``val_fraction`` a record has ``val_loss`` and ``val_accuracy`` instead of the test metrics,
which only the last record has.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

__all__ = [
    "CHECKPOINT_DIR",
    "CONFIG_FILE",
    "METRICS_FILE",
    "RunningMean",
    "append_record",
    "read_records",
    "truncate_records",
    "write_json",
]

CONFIG_FILE = "config.json"
CHECKPOINT_DIR = "checkpoints"  # under the workdir
METRICS_FILE = "metrics.jsonl"


def write_json(path: str | os.PathLike, data: dict) -> None:
    """Writes ``data`` atomically (temporary file, then rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _plain(value):
    # JSON has no NaN/inf; a diverged loss is written as null rather than invalid JSON.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def append_record(path: str | os.PathLike, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps({k: _plain(v) for k, v in record.items()}) + "\n")
        f.flush()


def read_records(path: str | os.PathLike) -> list[dict]:
    """The records of a ``metrics.jsonl``; a torn last line (a killed run) is dropped."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def truncate_records(path: str | os.PathLike, last_step: int) -> list[dict]:
    """Keeps the records up to ``last_step`` (a resumed run rewrites the ones after it)."""
    path = Path(path)
    kept = [r for r in read_records(path) if r.get("step", 0) <= last_step]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    os.replace(tmp, path)
    return kept


class RunningMean:
    """Means of per-step metrics since the last ``reset``; fed host values in batches."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.sums: dict[str, float] = {}
        self.count = 0

    def add(self, metrics: dict) -> None:
        for k, v in metrics.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v)
        self.count += 1

    def to_dict(self) -> dict:
        """JSON-ready; float64 sums round-trip through JSON exactly."""
        return {"sums": dict(self.sums), "count": self.count}

    @classmethod
    def from_dict(cls, saved: dict | None) -> RunningMean:
        """A meter continuing ``saved`` (``to_dict``); empty for None (older checkpoints)."""
        meter = cls()
        if isinstance(saved, dict):
            meter.sums = {str(k): float(v) for k, v in saved.get("sums", {}).items()}
            meter.count = int(saved.get("count", 0))
        return meter

    def mean(self, key: str) -> float:
        return self.sums.get(key, math.nan) / self.count if self.count else math.nan
