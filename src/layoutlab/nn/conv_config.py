"""What a model's convs are and run: their paths, settings and specs, the algorithm each
runs, and the conv plans made for them (``default_conv_plan``). ``nn.configure`` hands a
model new settings or a plan; nothing here changes a model.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import numpy as np
from flax import nnx

from layoutlab.nn.conv import Conv
from layoutlab.nn.conv_algos.geometry import ConvSpec
from layoutlab.nn.conv_algos.plan import ConvPlan, PlanEntry, as_plan
from layoutlab.nn.conv_intercept import intercept_convs
from layoutlab.nn.conv_names import AUTO
from layoutlab.nn.conv_settings import ConvSettings, check_kernel_storage
from layoutlab.nn.convert import check_activation_storage

__all__ = [
    "TABLE_SOURCE",
    "ConvPlanMismatch",
    "check_conv_options",
    "check_plan_fits",
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
    "settings_of",
    "table_made",
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


def check_conv_options(
    algorithm: str | None = None,
    kernel_storage: str | None = None,
    activation_storage: str | None = None,
) -> None:
    """Raise ``ValueError`` naming the fix for an unknown algorithm, kernel storage or
    activation storage, before any model is built (``None``: not given)."""
    if algorithm is not None and algorithm != AUTO:
        from layoutlab.nn.conv_algos.registry import check_name  # a name, parsed here

        check_name(algorithm)
    if kernel_storage is not None:
        check_kernel_storage(kernel_storage)
    if activation_storage is not None:
        check_activation_storage(activation_storage)


def conv_settings(model: nnx.Module) -> dict[str, tuple[str, str]]:
    """``{path: (algorithm, kernel_spec)}`` for every ``Conv``."""
    return {path: (c.algorithm, c.kernel_spec) for path, c in convs(model)}


def settings_of(model: nnx.Module) -> dict[str, ConvSettings]:
    """``{path: settings}`` of every ``Conv`` (what ``nn.configure`` takes back)."""
    return {path: c.settings for path, c in convs(model)}


def conv_specs(model: nnx.Module, x) -> dict[str, ConvSpec]:
    """``{path: spec}`` of every 2D ``Conv`` that ``model(x)`` runs (``x``: array or
    ShapeDtypeStruct), in call order: one abstract trace of a copy of ``model`` during which
    each conv call is intercepted (``conv_intercept.intercept_convs``) to read its input
    shape, and runs XLA's conv (the specs need shapes only). Nothing is computed, ``model``
    is not changed and no conv holds a callback. A conv called at several shapes reports the
    first."""
    graphdef, state = nnx.split(model)
    x = jax.ShapeDtypeStruct(np.shape(x), x.dtype)
    found: dict[str, ConvSpec] = {}

    def run(st, inp):
        copy = nnx.merge(graphdef, st, copy=True)
        paths = {id(conv): path for path, conv in convs(copy)}

        def record(conv: Conv, y):
            if conv.layout.num_spatial == 2:
                found.setdefault(paths[id(conv)], conv.spec(y.shape))
            return conv.compute(y, native=True)

        with intercept_convs(record):
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


def planned_entries(model: nnx.Module) -> dict[str, PlanEntry]:
    """``{path: entry}`` the model's convs carry (``nn.configure(model, plan)``)."""
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
        path: select_algorithm(specs[path], c.algorithm, c.plan_entry, c.settings.algorithm).name
        if path in specs
        else c.algorithm
        for path, c in convs(model)
    }


def missing_from_plan(model: nnx.Module, x, plan: ConvPlan | None = None) -> dict[str, ConvSpec]:
    """``{path: spec}`` of the ``"auto"`` convs of ``model(x)`` with no entry for their shape
    in ``plan`` (None: the entries the convs carry): they run XLA's native conv."""
    auto = {p for p, c in convs(model) if c.algorithm == AUTO}
    entries = planned_entries(model) if plan is None else dict(check_plan_fits(model, plan).items())
    return {
        p: s
        for p, s in conv_specs(model, x).items()
        if p in auto and (p not in entries or entries[p].spec_key != s.key())
    }


def plan_coverage(model: nnx.Module, x, plan: ConvPlan | None = None) -> tuple[int, int]:
    """``(missing, total)``: ``"auto"`` 2D convs of ``model(x)`` without a matching entry in
    ``plan`` (None: the entries they carry), of all its ``"auto"`` 2D convs."""
    auto = {p for p, c in convs(model) if c.algorithm == AUTO}
    total = sum(p in auto for p in conv_specs(model, x))
    return len(missing_from_plan(model, x, plan)), total


def check_plan_fits(model: nnx.Module, plan: ConvPlan) -> ConvPlan:
    """``plan``, if every conv it names is one of ``model``'s; else ``ConvPlanMismatch``
    (it was made for another model)."""
    unknown = sorted(set(plan) - {p for p, _ in convs(model)})
    if unknown:
        raise ConvPlanMismatch(type(model).__name__, unknown)
    return plan


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
    from layoutlab.nn.conv_algos.default_plan import default_algorithm, widened_dtype

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
        entries[path] = PlanEntry(algorithm, spec.key(), widened_dtype(spec, cpu_kind))
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
