"""The training state: everything a step reads and writes, as one pytree."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from layoutlab.loss_scale import NoOpLossScale
from layoutlab.train.ema import init_ema

__all__ = ["ModelDefs", "TrainState", "create_train_state", "split_model"]


class TrainState(NamedTuple):
    """``params`` are the model's ``nnx.Param``s; ``model_state`` is everything else the model
    holds (BatchNorm statistics, dropout RNG keys and counters); ``ema``: the weights'
    moving average (``train.ema.EmaState``), None without ``ema_decay``."""

    step: jax.Array
    params: nnx.State
    model_state: nnx.State
    opt_state: optax.OptState
    loss_scale: Any
    ema: Any = None


class ModelDefs(NamedTuple):
    """The static halves of a split model, one with train-mode and one with eval-mode flags."""

    train: nnx.GraphDef
    eval: nnx.GraphDef


def split_model(model: nnx.Module) -> tuple[ModelDefs, nnx.State, nnx.State]:
    """``(defs, params, model_state)``; ``nnx.merge(defs.train, params, model_state)``
    rebuilds the model."""
    model.train()
    train_def, params, model_state = nnx.split(model, nnx.Param, ...)
    model.eval()
    eval_def, _, _ = nnx.split(model, nnx.Param, ...)
    model.train()
    return ModelDefs(train_def, eval_def), params, model_state


def create_train_state(
    model: nnx.Module, tx: optax.GradientTransformation, loss_scale=None, ema: bool = False
) -> tuple[ModelDefs, TrainState]:
    """``ema``: keep a moving average of the weights (``train.ema``), starting from them."""
    defs, params, model_state = split_model(model)
    state = TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        model_state=model_state,
        opt_state=tx.init(params),
        loss_scale=loss_scale if loss_scale is not None else NoOpLossScale(),
        ema=init_ema(params, model_state) if ema else None,
    )
    return defs, state
