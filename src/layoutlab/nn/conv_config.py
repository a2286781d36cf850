"""Model-wide conv settings: the algorithm every 2D ``Conv`` uses, the conv plan its
``"auto"`` convs follow (``with_conv_plan``) and how kernels are stored.

All are static attributes of the ``Conv`` layers, so a jitted model retraces after a
change (nnx's graph definition changes) and never runs a stale trace.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import numpy as np
from flax import nnx

from layoutlab.nn.conv import Conv, check_kernel_storage
from layoutlab.nn.conv_algos.geometry import ConvSpec
from layoutlab.nn.conv_algos.plan import ConvPlan, PlanEntry, as_plan
from layoutlab.nn.conv_algos.registry import AUTO, XLA, Algorithm, check_name
from layoutlab.nn.convert import check_activation_storage, set_activation_storage

__all__ = [
    "TABLE_SOURCE",
    "ConvPlanMismatch",
    "check_conv_options",
    "configure_convs",
    "conv_settings",
    "conv_specs",
    "convs",
    "default_conv_plan",
    "has_depthwise",
    "missing_from_plan",
    "model_conv_specs",
    "plan_coverage",
    "planned_entries",
    "replanned",
    "running_algorithms",
    "set_conv_algorithm",
    "set_kernel_storage",
    "table_made",
    "with_conv_plan",
    "without_custom_calls",
]


def convs(model: nnx.Module) -> list[tuple[str, Conv]]:
    """``(path, conv)`` of every ``Conv`` in ``model``."""
    out = []
    for path, node in nnx.iter_graph(model):
        if isinstance(node, Conv):
            out.append(("/".join(str(p) for p in path), node))
    return out


def has_depthwise(model: nnx.Module) -> bool:
    """Whether ``model`` has a depthwise ``Conv`` (one group per input channel)."""
    return any(1 < c.groups == c.in_features for _, c in convs(model))


def _require_convs(model: nnx.Module, what: str) -> list[tuple[str, Conv]]:
    found = convs(model)
    if not found:
        raise ValueError(f"{type(model).__name__} has no layoutlab.nn.Conv layers to {what}.")
    return found


def set_conv_algorithm(
    model: nnx.Module, algorithm: str, algorithms: Mapping[str, Algorithm] | None = None
) -> nnx.Module:
    """Set ``algorithm`` on every 2D ``Conv`` of ``model`` in place (others stay ``xla``);
    returns ``model``. ``"auto"`` convs run their plan entry (``with_conv_plan``). Each conv
    captures the algorithm's value from ``algorithms`` (name -> ``Algorithm``), else from
    the table, now: tracing the model reads no table."""
    check_name(algorithm)
    for _, conv in _require_convs(model, "set an algorithm on"):
        conv.algorithm = algorithm if conv.layout.num_spatial == 2 else XLA
        conv.capture_algorithm(algorithms)
    return model


def set_kernel_storage(model: nnx.Module, storage: str) -> nnx.Module:
    """Move every ``Conv`` kernel to ``storage`` in place (``"layout"``/``"channels_last"``).

    ``"channels_last"`` removes the per-call kernel transpose of channels-first models on
    XLA:CPU. Do it after importing weights (torch import and ``convert_layout`` expect
    ``"layout"`` storage) and before saving checkpoints others will read.
    """
    for _, conv in _require_convs(model, "store kernels of"):
        conv.set_kernel_storage(storage)
    return model


def check_conv_options(
    algorithm: str | None = None,
    kernel_storage: str | None = None,
    activation_storage: str | None = None,
) -> None:
    """Raise ``ValueError`` naming the fix for an unknown algorithm, kernel storage or
    activation storage, before any model is built (``None``: not given)."""
    if algorithm is not None:
        check_name(algorithm)
    if kernel_storage is not None:
        check_kernel_storage(kernel_storage)
    if activation_storage is not None:
        check_activation_storage(activation_storage)


def configure_convs(
    model: nnx.Module,
    algorithm: str | None = None,
    kernel_storage: str | None = None,
    activation_storage: str | None = None,
    algorithms: Mapping[str, Algorithm] | None = None,
) -> nnx.Module:
    """``set_activation_storage``, ``set_conv_algorithm`` and ``set_kernel_storage`` in one
    call, in place; ``None`` leaves that setting alone, and a model without ``Conv`` layers is
    fine with algorithm ``"xla"`` or ``"auto"`` (the defaults) and any storage, so callers
    can pass their options through unconditionally. The activation storage goes first: the
    conv plan and kernel order then see the layout the convs compute in. A model that is not
    a ``models.ImageModel`` (no ``compute_layout``) always computes in its own layout."""
    if activation_storage is not None:
        check_activation_storage(activation_storage)
        if hasattr(model, "compute_layout"):
            set_activation_storage(model, activation_storage)
    if not convs(model) and algorithm in (None, XLA, AUTO):
        # The defaults (xla or auto, any storage) mean nothing without convs; an explicit
        # algorithm still raises below, naming the model.
        if kernel_storage is not None:
            check_kernel_storage(kernel_storage)
        return model
    if algorithm is not None:
        set_conv_algorithm(model, algorithm, algorithms)
    if kernel_storage is not None:
        set_kernel_storage(model, kernel_storage)
    return model


def conv_settings(model: nnx.Module) -> dict[str, tuple[str, str]]:
    """``{path: (algorithm, kernel_spec)}`` for every ``Conv``."""
    return {path: (c.algorithm, c.kernel_spec) for path, c in convs(model)}


def conv_specs(model: nnx.Module, x) -> dict[str, ConvSpec]:
    """``{path: spec}`` of every 2D ``Conv`` that ``model(x)`` runs (``x``: array or
    ShapeDtypeStruct), in call order. Traced abstractly on a copy whose convs report their
    spec to a local sink: nothing is computed and ``model`` is not changed. A conv called
    at several shapes reports the first."""
    graphdef, state = nnx.split(model)
    x = jax.ShapeDtypeStruct(np.shape(x), x.dtype)
    found: dict[str, ConvSpec] = {}

    def run(st, inp):
        copy = nnx.merge(graphdef, st, copy=True)
        for path, conv in convs(copy):
            conv.algorithm = XLA  # the specs need shapes only; skip tracing the algorithms
            conv.spec_sink = lambda spec, path=path: found.setdefault(path, spec)
        return copy(inp)

    jax.eval_shape(run, state, x)
    return found


def model_conv_specs(model: nnx.Module, x) -> list[ConvSpec]:
    """The distinct 2D conv specs ``model(x)`` runs, in call order (see ``conv_specs``)."""
    unique = {s.key(): s for s in conv_specs(model, x).values()}
    if not unique:
        raise ValueError(
            f"{type(model).__name__} runs no 2D layoutlab.nn.Conv on input {np.shape(x)}; "
            "nothing to autotune."
        )
    return list(unique.values())


class ConvPlanMismatch(ValueError):
    """A conv plan made for another model (it names convs this one does not have).
    ``message(field)`` says so for the config field that held the plan."""

    def __init__(self, model: str, unknown: list[str]):
        self.model, self.unknown = model, unknown
        super().__init__(self.message("conv_plan"))

    def message(self, field: str) -> str:
        shown = ", ".join(self.unknown[:5]) + (" ..." if len(self.unknown) > 5 else "")
        return (
            f"the conv plan names {len(self.unknown)} conv(s) {self.model} does not have "
            f"({shown}); it was made for another model: tune this one (`layoutlab autotune "
            f"convs`, `train --conv-algo auto`) or drop the plan (`--set {field}=null`)."
        )


def with_conv_plan(
    model: nnx.Module,
    plan: ConvPlan | Mapping | None,
    algorithms: Mapping[str, Algorithm] | None = None,
) -> nnx.Module:
    """A copy of ``model`` whose convs carry ``plan``'s entries (``None``: no entries, so
    every ``"auto"`` conv runs ``xla``) and their algorithms' values (from ``algorithms``,
    else the table, as ``set_conv_algorithm``); ``model`` is not changed.

    The entry is a static attribute of each ``Conv``, so the model's graph definition, and
    with it ``jax.jit``'s cache key, changes exactly when the plan does. A plan naming a path
    the model does not have raises ``ValueError`` (it was made for another model).
    """
    plan = as_plan(plan)
    found = dict(convs(model))
    unknown = sorted(set(plan) - set(found))
    if unknown:
        raise ConvPlanMismatch(type(model).__name__, unknown)
    copy = nnx.clone(model)
    for path, conv in convs(copy):
        conv.plan_entry = plan.get(path)
        conv.capture_algorithm(algorithms)
    return copy


def without_custom_calls(model: nnx.Module) -> nnx.Module:
    """``model`` itself when no conv runs an algorithm whose core makes custom calls
    (``Algorithm.custom_calls``), else a copy whose such convs run ``xla``: a program of the
    copy holds only XLA's own ops, so it runs where layoutlab's kernels are not registered
    (an exported artifact). Only the graph definition changes; the weights fit both."""
    if not any(c.impl is not None and c.impl.custom_calls for _, c in convs(model)):
        return model
    copy = nnx.clone(model)
    for _, conv in convs(copy):
        if conv.impl is not None and conv.impl.custom_calls:
            conv.algorithm, conv.plan_entry = XLA, None
            conv.capture_algorithm()
    return copy


def planned_entries(model: nnx.Module) -> dict[str, PlanEntry]:
    """``{path: entry}`` the model's convs carry (``with_conv_plan``)."""
    return {p: c.plan_entry for p, c in convs(model) if c.plan_entry is not None}


def running_algorithms(
    model: nnx.Module, x=None, *, specs: Mapping[str, ConvSpec] | None = None
) -> dict[str, str]:
    """``{path: algorithm}`` each conv of ``model(x)`` runs: after its plan entry (one chosen
    for another shape runs ``xla``) and after an algorithm's refusal of the shape
    (``select_algorithm``). ``specs``: ``conv_specs(model, x)`` when the caller has it
    (saves a trace; ``x`` is then not needed). A conv no spec names (not 2D, or not
    called) shows its configured algorithm."""
    from layoutlab.nn.conv_algos.dispatch import select_algorithm

    specs = conv_specs(model, x) if specs is None else specs

    return {
        path: select_algorithm(specs[path], c.algorithm, c.plan_entry, c.impl).name
        if path in specs
        else c.algorithm
        for path, c in convs(model)
    }


def missing_from_plan(model: nnx.Module, x) -> dict[str, ConvSpec]:
    """``{path: spec}`` of the ``"auto"`` convs of ``model(x)`` with no plan entry for their
    shape: they run XLA's native conv."""
    auto = {p for p, c in convs(model) if c.algorithm == AUTO}
    entries = planned_entries(model)
    return {
        p: s
        for p, s in conv_specs(model, x).items()
        if p in auto and (p not in entries or entries[p].spec_key != s.key())
    }


def plan_coverage(model: nnx.Module, x) -> tuple[int, int]:
    """``(missing, total)``: ``"auto"`` 2D convs of ``model(x)`` without a matching plan
    entry, of all its ``"auto"`` 2D convs."""
    auto = {p for p, c in convs(model) if c.algorithm == AUTO}
    total = sum(p in auto for p in conv_specs(model, x))
    return len(missing_from_plan(model, x)), total


# How the evidence of every entry default_conv_plan makes begins (default_plan's reasons).
TABLE_SOURCE = "default table"


def default_conv_plan(
    model: nnx.Module,
    x,
    objective: str,
    cpu_kind: str | None,
    specs: Mapping[str, ConvSpec] | None = None,
    keep: ConvPlan | Mapping | None = None,
) -> ConvPlan:
    """The shipped table's plan for every 2D conv ``model(x)`` runs (``conv_algos.
    default_plan``; ``cpu_kind`` None off CPU, where every conv runs ``xla``). Each entry's
    evidence says it came from the table, not from a measurement on this machine.
    ``specs``: ``conv_specs(model, x)`` when the caller has it (saves a trace). ``keep``: a
    plan whose entries, with their evidence, stand wherever they were made for the conv's
    very shape (a tuning at this batch); the table fills the rest."""
    from layoutlab.nn.conv_algos.default_plan import default_algorithm

    keep = as_plan(keep)
    entries, evidence = {}, {}
    for path, spec in (conv_specs(model, x) if specs is None else specs).items():
        kept = keep.get(path)
        if kept is not None and kept.spec_key == spec.key():
            entries[path] = kept
            if keep.evidence(path) is not None:
                evidence[path] = keep.evidence(path)
            continue
        algorithm, why = default_algorithm(spec, objective, cpu_kind)
        entries[path] = PlanEntry(algorithm, spec.key())
        evidence[path] = {"source": why}
    return ConvPlan(entries, evidence)


def replanned(
    model: nnx.Module, x, objective: str, cpu_kind: str | None, plan: ConvPlan | Mapping | None
) -> ConvPlan | None:
    """The plan ``model(x)`` runs on the shipped table's ``objective`` rules
    (``default_conv_plan``) in place of ``plan``: whole when the table made ``plan`` (for
    another batch or objective), else keeping ``plan``'s entries made for these very shapes
    (a tuning's, a user's). None when that leaves ``plan``'s own entries and nothing else."""
    keep = None if plan is None or table_made(plan) else as_plan(plan)
    made = default_conv_plan(model, x, objective, cpu_kind, keep=keep)
    if keep and dict(made.items()) == dict(keep.items()):
        return None
    return made


def table_made(plan: ConvPlan | Mapping | None) -> bool:
    """Whether every entry of ``plan`` (a ``ConvPlan`` or its dict) came from the shipped
    table (``default_conv_plan``), not from a tuning or a user; False for an empty plan."""
    plan = None if plan is None else as_plan(plan)
    if not plan:
        return False
    return all(
        str((plan.evidence(p) or {}).get("source", "")).startswith(TABLE_SOURCE) for p in plan
    )
