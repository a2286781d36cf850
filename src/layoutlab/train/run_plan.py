"""The conv plan of a training run's ``"auto"`` convs, decided before anything compiles."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

from flax import nnx

from layoutlab.nn.conv_algos import AUTO
from layoutlab.nn.conv_config import plan_coverage
from layoutlab.train.agreement import agree_on_run, decided_by_process_0
from layoutlab.train.config import TrainConfig
from layoutlab.train.fast_config import with_default_plan
from layoutlab.train.program import build_model
from layoutlab.train.spec import InputSpec, resolve_spec

__all__ = ["abstract_model", "planned", "report_plan_coverage"]


def abstract_model(config: TrainConfig, inputs: InputSpec) -> nnx.Module:
    """The run's model as shapes (nothing computed)."""
    spec = resolve_spec(config)
    return nnx.eval_shape(lambda: build_model(spec, inputs))


def report_plan_coverage(
    config: TrainConfig, inputs: InputSpec, sharding, log, model: nnx.Module
) -> None:
    """``"auto"`` convs without a ``conv_plan`` entry for their shape run XLA's native conv;
    say how many, and how to plan them (bench/ sits above train/, so not from here).
    ``model``: ``abstract_model(config, inputs)``, which the caller has built already."""
    if config.conv_algorithm != AUTO:
        return
    spec = resolve_spec(config)
    images, _ = inputs.batch(spec.layout, sharding=sharding)
    missing, total = plan_coverage(model, images)
    if missing:
        log(
            f"conv_algorithm=auto: {missing} of {total} conv(s) have no conv_plan entry for "
            "their shape and run XLA's native conv; `layoutlab train --conv-algo auto` tunes "
            "them, as does layoutlab.bench.tuning.autotune_model(model, x) (its plan's "
            "to_dict() is the conv_plan)."
        )


def planned(
    config: TrainConfig, inputs: InputSpec, total_micro_steps: int, sharding,
    conv_planner: Callable | None, model: nnx.Module,
) -> TrainConfig:  # fmt: skip
    """``config`` with a conv plan, when it runs ``"auto"`` convs without one: decided by
    process 0 of a multi-process run alone (a tuning measures, the table depends on the
    CPU) and taken by the others. ``conv_planner(model, images, steps, compiler_options)``:
    the CLI's (cached, tuned or the table's); None, or its None: the shipped table's.
    ``model``: ``abstract_model(config, inputs)``, which the caller has built already."""
    if config.conv_algorithm != AUTO or config.conv_plan is not None:
        return config

    def decide() -> dict:
        spec = resolve_spec(config)
        images, _ = inputs.batch(spec.layout, sharding=sharding)
        if conv_planner is not None:
            options = spec.compile_options("train")
            plan = conv_planner(model, images, total_micro_steps, options)
            if plan is not None:
                return plan.to_dict()
        return with_default_plan(config, model, images).conv_plan

    config = dataclasses.replace(config, conv_plan=decided_by_process_0("conv plan", decide))
    # What every process compiles, checked like the rest of the run.
    agree_on_run(lambda: {"conv_plan": json.dumps(config.conv_plan, sort_keys=True)})
    return config
