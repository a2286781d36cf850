"""The best evaluation of a run: ``keep_best``'s metric, which way is better, the best value so
far and how many evaluations have passed without a better one (``early_stop``'s count).

``Best`` rides in every checkpoint (``extra["best"]``), so a resumed run compares its next
evaluations with the best of the steps before it, and counts toward ``early_stop`` from
where it stopped. This module imports no JAX (``train --help`` checks the config with it).
"""

from __future__ import annotations

import dataclasses
import math

__all__ = ["BEST_DIR", "METRICS", "Best", "Metric", "parse_metric"]

BEST_DIR = "best"  # <workdir>/best/<step>: the best checkpoint (train.checkpoint's layout)
# What an evaluation records: the validation split's while training when the run has one.
METRICS = ("val_accuracy", "val_loss", "test_accuracy", "test_loss")
_MODES = ("max", "min")


@dataclasses.dataclass(frozen=True)
class Metric:
    """A metric of the eval records and whether larger (``"max"``) or smaller is better."""

    name: str
    mode: str

    def better(self, new: float, old: float | None) -> bool:
        if not math.isfinite(new):
            return False
        if old is None:
            return True
        return new > old if self.mode == "max" else new < old

    def __str__(self) -> str:
        return f"{self.name}:{self.mode}"


def parse_metric(text: str, *, validation: bool) -> Metric:
    """``keep_best``'s ``NAME[:max|min]`` as a ``Metric``; ``validation``: whether the run
    holds a validation split (then its evaluations while training are ``val_*``, else
    ``test_*``). Raises ``ValueError`` naming the fix."""
    name, sep, mode = str(text).strip().partition(":")
    if name not in METRICS:
        raise ValueError(
            f"keep_best: unknown metric {name!r}; choose one of {', '.join(METRICS)}, "
            "optionally with :max or :min."
        )
    if sep and mode not in _MODES:
        raise ValueError(
            f"keep_best={text!r}: {mode!r} is neither max nor min; write {name}:max or {name}:min."
        )
    if name.startswith("val_") and not validation:
        raise ValueError(
            f"keep_best={name} needs a validation split; add --val-fraction F (e.g. 0.1), "
            f"or keep test_{name[4:]}."
        )
    if name.startswith("test_") and validation:
        raise ValueError(
            f"keep_best={name}: with val_fraction the test split is evaluated only at the "
            f"end; keep val_{name[5:]}."
        )
    return Metric(name, mode or ("max" if name.endswith("accuracy") else "min"))


@dataclasses.dataclass
class Best:
    """The best value of ``metric`` so far, its step and epoch, and the evaluations since."""

    metric: Metric
    value: float | None = None
    step: int | None = None
    epoch: float | None = None
    stale: int = 0  # evaluations in a row without a better value

    def update(self, record: dict) -> bool:
        """Takes an eval record; True when it is the best so far (its checkpoint is kept)."""
        value = record.get(self.metric.name)
        if value is not None and self.metric.better(float(value), self.value):
            self.value, self.step, self.epoch = float(value), record["step"], record.get("epoch")
            self.stale = 0
            return True
        self.stale += 1
        return False

    def stops(self, patience: int | None) -> bool:
        """Whether ``early_stop=patience`` ends the run here."""
        return patience is not None and self.stale >= patience

    def to_dict(self) -> dict:
        return {
            "metric": self.metric.name,
            "mode": self.metric.mode,
            "value": self.value,
            "step": self.step,
            "epoch": self.epoch,
            "stale": self.stale,
        }

    @classmethod
    def from_dict(cls, metric: Metric, saved: dict | None) -> Best:
        """The ``Best`` a checkpoint saved (``to_dict``) if it watched ``metric``; a fresh one
        otherwise (a checkpoint from before keep_best)."""
        if not isinstance(saved, dict) or (saved.get("metric"), saved.get("mode")) != (
            metric.name,
            metric.mode,
        ):
            return cls(metric)
        value = saved.get("value")
        return cls(
            metric,
            None if value is None else float(value),
            saved.get("step"),
            saved.get("epoch"),
            int(saved.get("stale", 0)),
        )
