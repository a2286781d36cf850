"""The jitted train step of a run, compiled ahead of time for its batch shape and shardings."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from layoutlab.data import Dataset, augment
from layoutlab.layout import parse_layout
from layoutlab.train.config import TrainConfig
from layoutlab.train.fast_config import compile_options
from layoutlab.train.sharding import Shardings
from layoutlab.train.steps import make_train_step
from layoutlab.train.xla_compile import compile_with_options

__all__ = ["batch_spec", "compile_train_step"]


def _augment_fn(config: TrainConfig):
    if not config.augment:
        return None
    layout, seed = parse_layout(config.layout), config.seed

    def fn(key, images):
        return augment(jax.random.fold_in(key, seed), images, layout)

    return fn


def batch_spec(config: TrainConfig, dataset: Dataset, batch: int, sharding):
    h, w, c = dataset.image_shape
    shape = (batch, h, w, c) if parse_layout(config.layout).is_channels_last else (batch, c, h, w)
    return (
        jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding),
        jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=sharding),
    )


def compile_train_step(config, dataset, defs, tx, state, shard: Shardings, state_sharding):
    step = make_train_step(defs, tx, augment=_augment_fn(config))
    options = compile_options(config, "train")
    jitted = jax.jit(
        step,
        donate_argnums=0,
        out_shardings=(state_sharding, shard.replicated),
        compiler_options=options or None,
    )
    images, labels = batch_spec(config, dataset, config.batch_size, shard.batch)
    return compile_with_options(jitted.lower(state, images, labels), options)
