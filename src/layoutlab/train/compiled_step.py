"""The jitted train step of a run, compiled ahead of time for its batch shape and shardings."""

from __future__ import annotations

import jax

from layoutlab.train.program import Program
from layoutlab.train.sharding import Shardings
from layoutlab.train.xla_compile import compile_with_options

__all__ = ["compile_train_step", "lower_train_step"]


def lower_train_step(program: Program, state, shard: Shardings, state_sharding):
    """``program.train_step`` lowered for the run's batch and shardings, the state donated."""
    options = program.spec.compile_options("train")
    jitted = jax.jit(
        program.train_step,
        donate_argnums=0,
        out_shardings=(state_sharding, shard.replicated),
        compiler_options=options or None,
    )
    images, labels = program.batch(sharding=shard.batch)
    return jitted.lower(state, images, labels)


def compile_train_step(program: Program, state, shard: Shardings, state_sharding):
    """``lower_train_step`` compiled with the run's ``"train"`` options."""
    lowered = lower_train_step(program, state, shard, state_sharding)
    return compile_with_options(lowered, program.spec.compile_options("train"))
