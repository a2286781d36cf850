"""The conv plan of a training run's ``"auto"`` convs, decided before anything compiles."""

from __future__ import annotations

import json
from collections.abc import Callable

from flax import nnx

from layoutlab.nn.conv_algos import AUTO
from layoutlab.nn.conv_algos.plan import ConvPlan
from layoutlab.nn.conv_config import convs, plan_coverage
from layoutlab.train.agreement import agree_on_run, decided_by_process_0
from layoutlab.train.fast_config import table_plan
from layoutlab.train.program import build_model
from layoutlab.train.spec import InputSpec, RunSpec

__all__ = [
    "abstract_model",
    "current_eval_plan",
    "planned",
    "replan_stale_eval_plan",
    "report_plan_coverage",
]


def abstract_model(spec: RunSpec, inputs: InputSpec) -> nnx.Module:
    """The run's model as shapes (nothing computed)."""
    return nnx.eval_shape(lambda: build_model(spec, inputs))


def report_plan_coverage(
    spec: RunSpec, inputs: InputSpec, sharding, log, model: nnx.Module
) -> None:
    """``"auto"`` convs without a ``conv_plan`` entry for their shape run XLA's native conv;
    say how many, and how to plan them (bench/ sits above train/, so not from here).
    ``model``: ``abstract_model(spec, inputs)``, which the caller has built already."""
    if spec.conv_algorithm != AUTO:
        return
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
    spec: RunSpec, inputs: InputSpec, total_micro_steps: int, sharding,
    conv_planner: Callable | None, model: nnx.Module, eval_batch: int | None = None,
) -> RunSpec:  # fmt: skip
    """``spec`` with a conv plan, when it runs ``"auto"`` convs without one: decided by
    process 0 of a multi-process run alone (a tuning measures, the table depends on the
    CPU) and taken by the others. ``conv_planner(model, images, steps, compiler_options)``:
    the CLI's (cached, tuned or the table's); None, or its None: the shipped table's.
    ``model``: ``abstract_model(spec, inputs)``, which the caller has built already.

    The eval step gets a plan too (``eval_conv_plan``; a given one is kept): the table's inference
    rules at ``eval_batch``, the batch every test image is evaluated at (None: no eval plan). The
    training plan's entries are keyed by the training batch, so at any other batch every conv would
    run ``xla``, much slower (docs/performance/measurements.md#eval-plan). A tuned plan
    (``conv_planner``'s) keeps its entries for the shapes they were made for and the table fills the
    rest; at an eval batch equal to the training batch it needs no eval plan. A given ``conv_plan``
    gets none: the run is returned as it is."""
    if spec.conv_algorithm != AUTO or spec.conv_plan is not None:
        return spec

    def decide() -> dict:
        images, _ = inputs.batch(spec.layout, sharding=sharding)
        plan = None
        if conv_planner is not None:
            options = spec.compile_options("train")
            plan = conv_planner(model, images, total_micro_steps, options)
        if plan is None and convs(model):  # the shipped table's
            plan = table_plan(model, images, "train")
        eval_plan = spec.eval_conv_plan  # a given one is kept
        if eval_plan is None and eval_batch is not None:
            images, _ = inputs.batch(spec.layout, eval_batch)
            eval_plan = table_plan(model, images, "inference", plan)  # None: the plan fits
        return {"conv_plan": _json(plan), "eval_conv_plan": _json(eval_plan)}

    decided = decided_by_process_0("conv plan", decide)
    # The spec's TrainConfig parses the plans' JSON back into ConvPlans.
    spec = spec.with_plan(decided["conv_plan"], decided["eval_conv_plan"])
    # What every process compiles, checked like the rest of the run.
    agree_on_run(
        lambda: {
            "conv_plan": json.dumps(_json(spec.conv_plan), sort_keys=True),
            "eval_conv_plan": json.dumps(_json(spec.eval_conv_plan), sort_keys=True),
        }
    )
    return spec


def _json(plan: ConvPlan | None) -> dict | None:
    """A plan's JSON form: what process 0 hands the others (``decided_by_process_0``)."""
    return None if plan is None else plan.to_dict()


def current_eval_plan(spec: RunSpec, model: nnx.Module, images) -> ConvPlan | None:
    """The eval plan for ``spec``'s eval step on ``images`` (abstract is fine): the stored
    ``eval_conv_plan`` when an entry of it fits a conv there. When none does, the eval batch
    changed since the run was planned (another ``eval_batch_size`` or device count, or a
    run from before evaluation ran equal batches), and the stale plan would run every conv
    on XLA's: then the table's inference rules at this batch, as ``planned`` makes them. A
    run that stores no eval plan keeps none (its eval step runs ``conv_plan``).
    ``model``: the run's model, abstract (``abstract_model``) or restored."""
    stored = spec.eval_conv_plan
    if spec.conv_algorithm != AUTO or stored is None:
        return stored
    missing, total = plan_coverage(model, images, stored)
    if missing < total:
        return stored
    return table_plan(model, images, "inference", spec.conv_plan)


def replan_stale_eval_plan(
    spec: RunSpec, inputs: InputSpec, model: nnx.Module, eval_batch: int | None
) -> RunSpec:
    """``spec`` with ``current_eval_plan`` at ``eval_batch`` (the stored plan of a resumed
    or re-evaluated run may be for another batch), decided by process 0 and checked like
    ``planned``'s; ``spec`` itself when that is the stored plan."""
    stored = spec.eval_conv_plan
    if eval_batch is None or stored is None or spec.conv_algorithm != AUTO:
        return spec
    images, _ = inputs.batch(spec.layout, eval_batch)
    decided = decided_by_process_0(
        "eval plan", lambda: {"eval_conv_plan": _json(current_eval_plan(spec, model, images))}
    )
    replanned = spec.with_plan(spec.conv_plan, decided["eval_conv_plan"])
    if replanned.eval_conv_plan == stored:
        return spec
    spec = replanned
    agree_on_run(lambda: {"eval_conv_plan": json.dumps(_json(spec.eval_conv_plan), sort_keys=True)})
    return spec
