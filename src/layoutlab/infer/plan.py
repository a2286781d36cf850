"""The conv plan of a run's inference forward at the batch size it is called with.

A run's ``config.json`` keeps the plan training ran, keyed by the conv shapes at the run's
batch size, so at any other batch no entry matches and every conv runs ``xla``: ``predict``
on one image of a MobileNetV2 run ran XLA's grouped convs, which the table's depthwise rule
runs several times faster. The table has inference rules per batch
(``nn.conv_algos.default_plan``); ``inference_plan`` gives them for the forward's own batch
on this machine: in place of a plan the table made, and for the convs a tuned or given plan
has no entry for at that batch (its entries for those very shapes stand). A run with one
algorithm for every conv is the user's choice and is kept. The weights do not depend on the
plan, only the model's graph definition does.
"""

from __future__ import annotations

import numpy as np
from flax import nnx

from layoutlab.nn.configuration import configure
from layoutlab.nn.conv_algos import AUTO, ConvPlan
from layoutlab.nn.conv_config import replanned, table_made
from layoutlab.train.spec import RunSpec

__all__ = ["inference_plan", "planned_by_table", "planned_model"]


def planned_by_table(spec: RunSpec) -> bool:
    """Whether ``spec`` runs ``"auto"`` convs on a plan made wholly by the shipped table."""
    return spec.conv_algorithm == AUTO and table_made(spec.conv_plan)


def inference_plan(spec: RunSpec, model, images, cpu_kind: str | None) -> ConvPlan | None:
    """The plan ``model(images)`` runs: the table's inference rules (``cpu_kind``: this
    machine's, None off CPU) at ``images``' batch, with the entries of a tuned or given run
    plan that were made for these very shapes; the run's own plan (the same object) when
    that is all it would hold. ``images``: an array or ShapeDtypeStruct in the run's layout.
    A symbolic batch keeps the run's plan: the custom algorithms need concrete shapes, so
    every conv runs XLA's there whatever the plan (``conv_algos.dispatch.conv2d``)."""
    if spec.conv_algorithm != AUTO or not isinstance(images.shape[0], int | np.integer):
        return spec.conv_plan
    made = replanned(model, images, "inference", cpu_kind, spec.conv_plan)
    return spec.conv_plan if made is None else made


def planned_model(spec: RunSpec, model: nnx.Module, images, cpu_kind: str | None):
    """A copy of ``model`` (eval mode, in any layout; ``images`` in that layout) on the plan
    ``inference_plan`` gives for ``model(images)``, or None when that is the run's own plan,
    which ``model`` already carries."""
    plan = inference_plan(spec, model, images, cpu_kind)
    if plan == spec.conv_plan:
        return None
    return configure(model, plan, algorithms=spec.with_plan(plan).algorithms)
