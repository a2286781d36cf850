"""The fast defaults of a run, resolved where the run is set up (never while tracing).

- ``compile_options(config, mode)``: the XLA options of a run's ``"train"`` or ``"infer"``
  programs: ``fast_defaults.fast_compile_options(mode)`` (on CPU, when ``cpu_fast``) under
  the run's own ``xla_options``; every command derives its options here.
- ``with_default_plan(config, model, images)``: an ``"auto"`` run without a ``conv_plan``
  gets the shipped table's (``nn.conv_algos.default_plan``), stored in its config.json;
  ``table_plan(model, images, objective)``: the table's plan, e.g. for its eval step.
"""

from __future__ import annotations

import dataclasses

from layoutlab.data.source_forms import known_image_shape
from layoutlab.fast_defaults import default_backend, table_cpu_kind
from layoutlab.models import model_compile_options, spec
from layoutlab.nn.conv_algos import AUTO
from layoutlab.nn.conv_config import convs, replanned
from layoutlab.precision import Policy, get_policy
from layoutlab.train.config import TrainConfig

__all__ = ["compile_options", "table_plan", "with_default_plan"]


_FROM_CONFIG = object()  # batch and input shape not given: the config's own


def compile_options(
    config: TrainConfig,
    mode: str,
    *,
    backend: str | None = None,
    batch: int | None = _FROM_CONFIG,
    input_shape: tuple[int, ...] | None = _FROM_CONFIG,
    policy: Policy | None = None,
) -> dict:
    """The XLA compile options of ``config``'s ``mode`` ("train" or "infer") programs on
    ``backend`` (None: JAX's): the fast defaults of its model's step (``cpu_fast``, on CPU;
    ``models.model_compile_options``) at ``batch`` examples of ``input_shape`` (channels last),
    under the config's own ``xla_options``. The one place a run's options are derived:
    ``train`` takes the config's batch (a training step's) and its data's image shape,
    ``inspect``, ``bench``, ``compare`` and ``autotune convs``, which build no data set, give
    theirs. ``policy``: the config's, parsed already (``resolve_spec``); None: parsed here."""
    if batch is _FROM_CONFIG:
        batch = config.batch_size if mode == "train" else None
    base = {}
    if config.cpu_fast:
        if input_shape is _FROM_CONFIG:
            input_shape = _data_shape(config)
        base = model_compile_options(
            config.model,
            config.model_kwargs,
            mode,
            backend,
            config.optimizer,
            batch,
            input_shape,
            # Only the shipped table's plan (``"auto"``) is known here to put convs on oneDNN.
            compute_dtype=_compute_dtype(config, policy) if config.conv_algorithm == AUTO else None,
        )
    return {**base, **config.xla_options}


def _compute_dtype(config: TrainConfig, policy: Policy | None):
    return (policy or get_policy(config.precision)).compute_dtype


def _data_shape(config: TrainConfig) -> tuple[int, ...] | None:
    """The run's examples' shape where its data source tells (channels last), else None."""
    shape = known_image_shape(config.data)
    if shape is None:
        return None
    # The run builds the model for the data's channels; its conv outputs do not depend on
    # them, so the size is read with the model's own.
    channels = config.model_kwargs.get("in_channels", spec(config.model).default_input[-1])
    return (*shape[:-1], channels)


def with_default_plan(config: TrainConfig, model, images) -> TrainConfig:
    """``config`` with the shipped table's conv plan for ``model(images)`` (abstract is
    fine) when it runs ``"auto"`` convs and has no plan; otherwise ``config`` unchanged."""
    if config.conv_algorithm != AUTO or config.conv_plan is not None or not convs(model):
        return config
    return dataclasses.replace(config, conv_plan=table_plan(model, images, "train"))


def table_plan(model, images, objective: str, plan=None):
    """The shipped table's plan for ``model(images)`` (abstract is fine) on this backend:
    ``objective`` ``"train"`` for a run's training step, ``"inference"`` for its eval step
    at the eval batch, in place of ``plan`` (``nn.conv_config.replanned``: a tuned plan's
    entries for these very shapes stand; None when they are all it would hold)."""
    return replanned(model, images, objective, table_cpu_kind(default_backend()), plan)
