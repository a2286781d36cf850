"""A sweep checked and made canonical before anything runs (``validate``): its run's
fields and each axis's values in their one form, a ``ValueError`` naming what is wrong."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping

from flax import nnx

from layoutlab import models
from layoutlab.arguments import CONV_TUNE_CHOICES
from layoutlab.bench.cases import MODES
from layoutlab.bench.sweep_cases import points
from layoutlab.bench.sweep_config import (
    SweepConfig,
    check_compile_options,
    options_for,
    point_input,
    resolve_input,
)
from layoutlab.fast_defaults import resolve_activation_storage, resolve_kernel_storage
from layoutlab.nn.conv_config import check_conv_options
from layoutlab.precision import get_policy
from layoutlab.train.config import TrainConfig, field_names
from layoutlab.train.spec import config_for
from layoutlab.xla import resolve_backend

__all__ = ["makes_pytorch_update", "validate"]


def _positive_int(value, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field} values must be positive ints, got {value!r}.")
    return value


def _canonical(field: str, value, num_spatial: int, backend):
    """A run field's value in its one form (a layout's canonical name, a storage resolved
    for the backend, XLA options normalised), or a ``ValueError`` naming what is wrong."""
    if field == "layout":
        return models.resolve_layout(value, num_spatial).name
    if field == "precision":
        get_policy(value)  # unknown precision: ValueError listing the presets
    elif field == "batch_size":
        _positive_int(value, field)
    elif field == "conv_algorithm":
        check_conv_options(value, None)
    elif field == "kernel_storage":
        value = resolve_kernel_storage(value, backend.platform)
        check_conv_options(None, value)
    elif field == "activation_storage":
        value = resolve_activation_storage(value, backend.platform)
        check_conv_options(None, None, value)
    elif field == "xla_options":
        value = check_compile_options(value, backend.name)
    else:
        TrainConfig.from_dict({field: value})  # its type: ValueError naming the field
    return value


def _axes(config: SweepConfig, num_spatial: int, backend) -> dict[str, tuple]:
    """The sweep's axes, each a non-empty tuple of canonical values without repeats."""
    if not isinstance(config.axes, Mapping):
        raise ValueError(f"axes must map TrainConfig fields to values, got {config.axes!r}.")
    known = field_names()
    out = {}
    for field, values in config.axes.items():
        if field not in known:
            raise ValueError(
                f"Unknown sweep axis {field!r}: an axis is a TrainConfig field, one of "
                f"{', '.join(known)}."
            )
        if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
            raise ValueError(f"axis {field} must be a list of values, got {values!r}.")
        unique = []
        for value in values:
            value = _canonical(field, value, num_spatial, backend)
            if value not in unique:  # values may be unhashable (model_kwargs)
                unique.append(value)
        if not unique:
            raise ValueError(f"axis {field} is empty; give it at least one value.")
        out[field] = tuple(unique)
    return out


def validate(config: SweepConfig) -> SweepConfig:
    """The config with canonical values, or a ``ValueError`` naming what is wrong."""
    run = config.run
    if not isinstance(run, TrainConfig):
        raise ValueError(f"run must be a TrainConfig, got {type(run).__name__}.")
    spec = models.spec(run.model)  # unknown model: ValueError listing the known ones
    modes = tuple(dict.fromkeys(config.modes))
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ValueError(f"Unknown modes {bad or modes!r}; use any of: {', '.join(MODES)}.")
    if config.max_step_s is not None and not config.max_step_s > 0:
        raise ValueError(
            f"max_step_s must be a positive number of seconds, got {config.max_step_s}."
        )
    auto = config.repeats == "auto"
    if not auto and not (isinstance(config.repeats, int) and config.repeats >= 1):
        raise ValueError(f"repeats must be 'auto' or an integer >= 1, got {config.repeats!r}.")
    if config.warmup < 0:
        raise ValueError(f"Need warmup >= 0, got warmup={config.warmup}.")
    if not (0 < config.target < 1 and config.time_budget_s > 0):
        raise ValueError(
            f"target must lie in (0, 1) and time_budget_s be > 0, got {config.target} and "
            f"{config.time_budget_s}."
        )
    backend = resolve_backend(config.backend)  # unknown or absent: BackendError (ValueError)
    if config.conv_tune not in CONV_TUNE_CHOICES:
        raise ValueError(f"conv_tune must be auto, always or never, got {config.conv_tune!r}.")
    if config.conv_tune_repeats < 1:
        raise ValueError(f"conv_tune_repeats must be >= 1, got {config.conv_tune_repeats}.")
    axes = _axes(config, spec.num_spatial, backend)
    fields = ("layout", "precision", "batch_size", "conv_algorithm", "kernel_storage",
              "activation_storage", "xla_options")  # fmt: skip
    run = dataclasses.replace(
        run, **{f: _canonical(f, getattr(run, f), spec.num_spatial, backend) for f in fields}
    )
    check_conv_options(None, run.kernel_storage, run.activation_storage)
    config = dataclasses.replace(config, run=run, axes=axes, modes=modes)
    if not {"model", "model_kwargs"} & set(axes):  # else each point's model has its own
        shape, classes = resolve_input(
            run.model, run.model_kwargs, config.image_size, config.channels, config.num_classes
        )
        config = dataclasses.replace(
            config, image_size=shape[:-1], channels=shape[-1], num_classes=classes
        )
    _check_points(config, backend)
    return config


def makes_pytorch_update(run: TrainConfig) -> bool:
    """Whether ``run``'s train step makes the PyTorch runner's update (SGD with momentum)."""
    sgd = config_for("pytorch")
    keys = ("optimizer", "learning_rate", "momentum", "weight_decay", "schedule",
            "warmup_steps", "accum_steps")  # fmt: skip
    return all(getattr(run, k) == getattr(sgd, k) for k in keys)


def _check_points(config: SweepConfig, backend) -> None:
    """Fail now, not in every configuration: beside PyTorch each run must make its update,
    each model of the sweep must build with its options (abstractly: nothing is computed or
    compiled) and XLA must take each set of ``cpu_fast`` options, which were probed on their
    own and may clash with the run's."""
    runs = points(config)
    if config.torch and not all(makes_pytorch_update(run) for run in runs):
        raise ValueError(
            "torch times PyTorch's SGD-with-momentum step beside layoutlab's, which must make "
            "the same update: make the run with train.spec.config_for('pytorch', ...) (what "
            "`layoutlab bench --torch` runs), or drop torch."
        )
    models_seen, options_seen = [], []
    for run in runs:
        if (run.model, run.model_kwargs) in models_seen:
            continue
        models_seen.append((run.model, run.model_kwargs))
        shape, classes = point_input(config, run)
        nnx.eval_shape(
            lambda run=run, shape=shape, classes=classes: models.create(
                run.model, num_classes=classes, in_channels=shape[-1], **run.model_kwargs
            )
        )
    for run, mode in itertools.product(runs, config.modes):
        if run.cpu_fast:
            options = options_for(config, mode, backend.platform, None, run)
            if options not in options_seen:
                options_seen.append(options)
                check_compile_options(options, backend.name)
