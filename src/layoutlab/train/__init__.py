"""Training: state, steps, loop, checkpoints and metrics.

``train_and_evaluate(TrainConfig(...), workdir)`` is the entry point; ``layoutlab train`` is a
thin shell over it.
"""

from layoutlab.train.checkpoint import (
    Checkpointer,
    CheckpointError,
    CorruptCheckpointError,
    IncompatibleCheckpointError,
    read_checkpoint,
)
from layoutlab.train.config import TrainConfig, apply_overrides, validate
from layoutlab.train.loop import train_and_evaluate
from layoutlab.train.metrics import read_records
from layoutlab.train.optim import make_optimizer, make_schedule
from layoutlab.train.plot import plot_metrics
from layoutlab.train.resume import ResumeError
from layoutlab.train.sharding import make_shardings
from layoutlab.train.workdir import WorkdirError

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "CorruptCheckpointError",
    "IncompatibleCheckpointError",
    "ResumeError",
    "TrainConfig",
    "WorkdirError",
    "apply_overrides",
    "make_optimizer",
    "make_schedule",
    "make_shardings",
    "plot_metrics",
    "read_checkpoint",
    "read_records",
    "train_and_evaluate",
    "validate",
]
