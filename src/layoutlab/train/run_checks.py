"""The checks ``train_and_evaluate`` makes before it compiles anything: that the run's model
builds and runs on its data set's images (``check_dataset``), and that XLA takes its compile
options (``check_xla_options``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from layoutlab.data import Dataset
from layoutlab.nn.conv_config import ConvPlanMismatch, check_plan_fits
from layoutlab.train.run_memory import PROBE_BATCH, check_run_fits, forward_bytes
from layoutlab.train.run_plan import abstract_model
from layoutlab.train.spec import InputSpec, RunSpec
from layoutlab.train.xla_compile import compile_with_options

__all__ = ["check_dataset", "check_xla_options"]


def check_dataset(spec: RunSpec, dataset: Dataset) -> nnx.Module:
    """The run's abstract model (``run_plan.abstract_model``) once ``spec`` is known to
    build and run on ``dataset``'s images; the run's later steps reuse it."""
    config = spec.config
    channels = config.model_kwargs.get("in_channels")
    if channels is not None and channels != dataset.num_channels:
        raise ValueError(
            f"model_kwargs.in_channels={channels} but {config.data!r} has "
            f"{dataset.num_channels} channels; drop in_channels (it is set from the data)."
        )
    # Abstractly (no compile, no FLOPs): values the types allow but the model cannot take,
    # such as width=-3, fail here with the kwargs named instead of deep inside JAX.
    # The model depends on the data's classes and channels, not on the batch: built for the
    # run's batch (what the run reuses), called on two images (all the check needs).
    try:
        model = abstract_model(spec, InputSpec.of(dataset, spec.batch_size))
        images, _ = InputSpec.of(dataset, PROBE_BATCH).batch(spec.layout)
        probe = forward_bytes(model, images)  # what a batch's forward keeps for backward
    except ConvPlanMismatch as e:  # not a model_kwargs problem: the plan came from elsewhere
        raise ValueError(f"conv_plan: {e}") from None
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(
            f"{config.model!r} cannot be built with model_kwargs {config.model_kwargs} for "
            f"{dataset.name} ({type(e).__name__}: {first}); fix those values."
        ) from None
    check_run_fits(config, model, probe, dataset.num_classes)
    if config.eval_conv_plan is not None:
        try:
            check_plan_fits(model, config.eval_conv_plan)
        except ConvPlanMismatch as e:
            raise ValueError(f"eval_conv_plan: {e.message('eval_conv_plan')}") from None
    return model


def check_xla_options(options: dict) -> None:
    """Raise the ``ValueError`` of ``train_and_evaluate`` if XLA rejects ``options`` (a name
    it does not know, a value of the wrong type), by compiling a trivial program."""
    if options:
        lowered = jax.jit(lambda x: x + 1, compiler_options=options).lower(jnp.float32(0))
        compile_with_options(lowered, options)
