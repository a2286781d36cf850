"""Conv algorithm autotuning for a registry model: every conv shape it runs, one call.

The Python side of ``layoutlab autotune convs``: the choices land in the autotune cache (so
a later ``layoutlab bench --conv-algos auto`` or ``layoutlab train --conv-algo auto`` with
the same settings only reads it) and come back as the model's ``ConvPlan``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from layoutlab import models
from layoutlab.bench.cases import parse_shape
from layoutlab.bench.sweep_config import check_compile_options, resolve_input
from layoutlab.bench.tuning.convs import ConvTuning, autotune_model
from layoutlab.nn.conv_config import check_conv_options
from layoutlab.train.program import create_model
from layoutlab.train.spec import InputSpec, config_for, resolve_spec

__all__ = ["autotune_registry_model"]


def autotune_registry_model(
    model: str,
    batch_size: int,
    input_shape=None,
    *,
    layout: str = "NHWC",
    precision: str = "fp32",
    objective: str = "train",
    kernel_storage: str = "layout",
    activation_storage: str = "layout",
    compiler_options: dict | None = None,
    model_kwargs: dict | None = None,
    num_classes: int | None = None,
    backend: str | None = None,
    repeats: int = 3,
    cache=None,
    refresh: bool = False,
    algorithms=None,
) -> ConvTuning:
    """Tune the conv algorithm of every conv shape of ``model`` at this batch size, input
    shape (``"HxWxC"`` or a tuple, channels last; None: the model's default), layout,
    precision and XLA ``compiler_options``; returns the plan and one ``TuneResult`` per shape.
    ``algorithms``: the candidates (None: every registered one that applies to a shape)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
    kwargs = dict(model_kwargs or {})
    spec = models.spec(model)
    lay = models.resolve_layout(layout, spec.num_spatial)
    check_conv_options(None, kernel_storage, activation_storage)
    options = check_compile_options(compiler_options, backend) or None
    shape = parse_shape(input_shape) if isinstance(input_shape, str) else input_shape
    shape, classes = resolve_input(
        model,
        kwargs,
        None if shape is None else shape[:-1],
        None if shape is None else shape[-1],
        num_classes,
    )
    run = resolve_spec(
        config_for(
            model=spec.name,
            model_kwargs=kwargs,
            layout=lay.value,
            precision=precision,
            kernel_storage=kernel_storage,
            activation_storage=activation_storage,
        )
    )
    # Built abstractly, as train builds it: only the conv shapes matter, no weights are made.
    net = nnx.eval_shape(lambda: create_model(run, InputSpec(tuple(shape), classes, batch_size)))
    x = jax.ShapeDtypeStruct(lay.shape(batch_size, shape[-1], shape[:-1]), jnp.float32)
    return autotune_model(
        net,
        x,
        objective=objective,
        compiler_options=options,
        backend=backend,
        repeats=repeats,
        cache=cache,
        refresh=refresh,
        algorithms=algorithms,
    )
