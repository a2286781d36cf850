"""Training: state, steps, loop, checkpoints and metrics.

``train_and_evaluate(TrainConfig(...), workdir)`` is the entry point; ``layoutlab train`` is a
thin shell over it. ``resolve_spec(config)`` resolves a config once into a ``RunSpec`` and
``build_program(spec, inputs)`` builds its model, state and steps, as train, inspect, bench,
compare and infer all do.


Names load lazily (``layoutlab.lazy``), so importing the package, as the CLI does
to build its parser, imports no JAX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from layoutlab.lazy import lazy_exports

if TYPE_CHECKING:
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
    from layoutlab.train.optim import OptimizerSpec, make_optimizer, make_schedule
    from layoutlab.train.plot import plot_metrics
    from layoutlab.train.program import Program, build_program
    from layoutlab.train.resume import ResumeError
    from layoutlab.train.sharding import make_shardings
    from layoutlab.train.spec import InputSpec, RunSpec, resolve_spec
    from layoutlab.train.workdir import WorkdirError

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
    "OptimizerSpec": "optim",
    "make_optimizer": "optim",
    "make_schedule": "optim",
    "Program": "program",
    "build_program": "program",
    "InputSpec": "spec",
    "RunSpec": "spec",
    "resolve_spec": "spec",
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
    "InputSpec",
    "OptimizerSpec",
    "Program",
    "ResumeError",
    "RunSpec",
    "TrainConfig",
    "WorkdirError",
    "apply_overrides",
    "build_program",
    "make_optimizer",
    "make_schedule",
    "make_shardings",
    "plot_metrics",
    "read_checkpoint",
    "read_records",
    "resolve_spec",
    "train_and_evaluate",
    "validate",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, lambda: set(globals()))
