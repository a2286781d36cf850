"""Training: state, steps, loop, checkpoints and metrics.

``train_and_evaluate(TrainConfig(...), workdir)`` is the entry point; ``layoutlab train`` is a
thin shell over it.


Names load lazily (``layoutlab.lazy``), so importing the package, as the CLI does
to build its parser, imports no JAX.
"""

from __future__ import annotations

from layoutlab.lazy import lazy_exports

_EXPORTS = {
    "Checkpointer": "checkpoint",
    "CheckpointError": "checkpoint",
    "CorruptCheckpointError": "checkpoint",
    "IncompatibleCheckpointError": "checkpoint",
    "read_checkpoint": "checkpoint",
    "TrainConfig": "config",
    "apply_overrides": "config",
    "validate": "config",
    "train_and_evaluate": "loop",
    "read_records": "metrics",
    "make_optimizer": "optim",
    "make_schedule": "optim",
    "plot_metrics": "plot",
    "ResumeError": "resume",
    "make_shardings": "sharding",
    "WorkdirError": "workdir",
}

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

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, lambda: set(globals()))
