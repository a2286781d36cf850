"""The jitted train step of a run, compiled ahead of time for its batch shape and shardings."""

from __future__ import annotations

import jax

from layoutlab.train.program import Program
from layoutlab.train.sharding import Shardings
from layoutlab.train.xla_compile import compile_with_options

__all__ = ["compile_train_step"]


def compile_train_step(program: Program, state, shard: Shardings, state_sharding):
    """``program.train_step`` compiled for the run's batch with its ``"train"`` options; the
    state is donated."""
    options = program.spec.compile_options("train")
    jitted = jax.jit(
        program.train_step,
        donate_argnums=0,
        out_shardings=(state_sharding, shard.replicated),
        compiler_options=options or None,
    )
    images, labels = program.batch(sharding=shard.batch)
    return compile_with_options(jitted.lower(state, images, labels), options)
