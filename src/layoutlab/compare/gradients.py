"""Per-parameter gradient comparison of two runs of one architecture, in backprop order:
a bug in one layer's backward leaves the layers after it intact, so the first failing row
names it."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from flax import nnx

from layoutlab.compare.decisions import Decision, FlipSite, probe_decisions
from layoutlab.compare.layer_recording import (
    LayerOutput,
    Program,
    canonical_path,
    highest_precision,
    model_layout,
    module_table,
    options_key,
    record_layers,
    run_program,
    set_mode,
    signature,
)
from layoutlab.compare.layer_report import (
    LayerTolerance,
    LayerwiseReport,
    compare_records,
)
from layoutlab.layout import Layout
from layoutlab.nn.convert import convert_layout
from layoutlab.train.steps import cross_entropy

__all__ = [
    "loss_fn",
    "parameter_grads",
    "probed_parameter_grads",
    "ProbedGrads",
    "grads_to_layout",
    "compare_grad_trees",
]


def loss_fn(logits: jax.Array, labels: jax.Array, layout: Layout) -> jax.Array:
    """Mean softmax cross-entropy in float32; per-pixel logits have their class axis moved
    last first, so classification and segmentation models share one loss."""
    return cross_entropy(logits, labels, layout.channel_axis if logits.ndim == layout.rank else -1)


def parameter_grads(
    model: nnx.Module,
    x: Any,
    labels: Any,
    *,
    train: bool = True,
    compiler_options: dict | None = None,
) -> tuple[float, nnx.State, list[str]]:
    """``(loss, grads, module order)``: gradients of ``loss_fn`` w.r.t. every ``nnx.Param``
    (an ``nnx.State`` shaped like the params) and the canonical paths of the layers in
    execution order, for ordering the gradient table. ``compiler_options``: XLA options of
    the compile."""
    run = probed_parameter_grads(
        model, x, labels, train=train, compiler_options=compiler_options, probe=False
    )
    return run.loss, run.grads, run.order


class ProbedGrads(NamedTuple):
    """``parameter_grads``'s results plus the ReLU/max-pool decisions of the same compiled
    program (``compare.decisions``) and the module calls in the order they returned."""

    loss: float
    grads: nnx.State
    order: list[str]
    decisions: list[Decision]
    done: list[str]


def probed_parameter_grads(
    model: nnx.Module,
    x: Any,
    labels: Any,
    *,
    train: bool = True,
    compiler_options: dict | None = None,
    pins: dict | None = None,
    probe: bool = True,
) -> ProbedGrads:
    """``parameter_grads`` that also returns every ReLU/ReLU6/max-pool decision the
    compiled forward took and, with ``pins``, follows the given decisions instead
    (``probe_decisions``). The decisions are outputs of the gradient program itself, so
    they are the ones its gradients saw.

    A later call on a model of the same structure and mode with the same options, and
    without pins, runs the program already compiled (``layer_recording.PROGRAMS``)."""
    model = set_mode(model, train)
    layout = model_layout(model)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    args = (params, rest, x, labels)
    key = ("grads", graphdef, layout, train, probe, options_key(compiler_options))
    # Pinned programs are not kept: the pins are constants of the program (as arguments,
    # XLA fuses the pinned program differently and its gradients move by an ulp), as large
    # as the model's activations, and a rerun seldom repeats the same decisions.
    with highest_precision():
        ((value, values), grads), (order, meta, done) = run_program(
            None if pins else key, lambda: _grad_program(*key[1:], pins), args
        )
    decisions = [
        Decision(site, kind, np.asarray(v), position)
        for (site, kind, position), v in zip(meta, values, strict=True)
    ]
    return ProbedGrads(float(value), grads, list(order), decisions, list(done))


def _grad_program(
    graphdef, layout: Layout, train: bool, probe: bool, options: tuple, pins
) -> Program:
    """The jitted ``(loss, decision values), grads`` of models split to ``graphdef`` (the
    structure, static attributes and mode; ``train`` is in it too, named for clarity).
    Params, state, input and labels are arguments, so jit's own cache keys the compiled
    programs on their shapes and dtypes; ``pins`` are copied because the program keeps
    them."""
    traced: dict = {}
    pinned = {site: np.array(v) for site, v in (pins or {}).items()}

    def loss(params, rest, x, labels):
        m = nnx.merge(graphdef, params, rest, copy=True)
        probing = probe_decisions(m, pinned) if probe else contextlib.nullcontext()
        with probing as log:
            logits, records = record_layers(m, x)
        found = log.decisions if probe else []
        traced[signature((params, rest, x, labels))] = (
            tuple(r.path for r in records),
            tuple((d.site, d.kind, d.position) for d in found),
            tuple(log.done) if probe else (),
        )
        return loss_fn(logits, labels, layout), [d.value for d in found]

    grad_fn = jax.value_and_grad(loss, has_aux=True)
    return Program(jax.jit(grad_fn, compiler_options=dict(options) or None), traced)


def grads_to_layout(model: nnx.Module, grads: nnx.State, layout: Layout) -> nnx.State:
    """Move a gradient tree of ``model`` to ``layout`` the way ``convert_layout`` moves its
    params (conv kernels permuted, everything else as is)."""
    if model_layout(model) == layout:
        return grads
    graphdef, _, rest = nnx.split(model, nnx.Param, ...)
    holder = nnx.merge(graphdef, grads, rest, copy=True)
    return nnx.state(convert_layout(holder, layout), nnx.Param)


def _grad_rows_order(
    model: nnx.Module, grads: nnx.State, order: Sequence[str], backward: bool
) -> list[tuple[str, str, np.ndarray]]:
    """``(param path, owning op, grad)`` in backprop order (the layer that runs last comes
    first) or, with ``backward=False``, in execution order; layers that never ran last."""
    nodes = module_table(model)
    rank = {}
    for i, path in enumerate(order):
        rank.setdefault(path.split("#")[0], -i if backward else i)
    never = 1 if backward else len(order)
    entries = []
    for path, value in nnx.to_flat_state(grads):
        owner_path = tuple(path[:-1])
        owner = canonical_path(owner_path, nodes)
        op = type(nodes[owner_path]).__name__ if owner_path in nodes else "?"
        name = canonical_path(path, nodes)
        array = np.asarray(value.get_value() if isinstance(value, nnx.Variable) else value)
        entries.append((rank.get(owner, never), name, op, array))
    entries.sort(key=lambda e: e[0])  # stable: params of one layer keep their order
    return [(name, op, array) for _, name, op, array in entries]


def compare_grad_trees(
    reference_model: nnx.Module,
    reference_grads: nnx.State,
    candidate_grads: nnx.State,
    tolerance: LayerTolerance,
    *,
    order: Sequence[str] = (),
    backward: bool = True,
    pinned: nnx.State | None = None,
    flips: Sequence[FlipSite] = (),
    done: Sequence[str] | None = None,
    reference_name: str = "reference",
    candidate_name: str = "candidate",
    settings: dict | None = None,
) -> LayerwiseReport:
    """Compare two gradient trees already in the reference model's layout, row by row in
    backprop order (``backward``; ``order`` is the layers' execution order), so the first
    failing row is where the backward pass starts to diverge.

    ``flips`` (where the candidate's ReLU/max-pool decisions differ from the reference's),
    ``done`` (the candidate's module calls in the order they returned) and ``pinned`` (the
    candidate's gradients on the reference's decisions) let a row reached by a flip, that
    is, a parameter whose layer ran before the flip's site, be judged on the pinned rerun
    and say which flips reach it; ``done=None``: decisions were not compared."""
    ref = _grad_rows_order(reference_model, reference_grads, order, backward)
    cand = _grad_rows_order(reference_model, candidate_grads, order, backward)
    report = compare_records(
        [LayerOutput(p, op, v) for p, op, v in ref],
        [LayerOutput(p, op, v) for p, op, v in cand],
        tolerance,
        kind="gradients",
        reference_name=reference_name,
        candidate_name=candidate_name,
        settings={"order": "backprop" if backward else "execution", **(settings or {})},
    )
    if done is None:
        return report
    summary = tuple((f.site, f.kind, f.count) for f in sorted(flips, key=lambda f: f.position))
    if not flips or pinned is None:
        return dataclasses.replace(report, decision_flips=summary)
    pins = _grad_rows_order(reference_model, pinned, order, backward)
    pinned_rows = {
        r.path: r.report
        for r in compare_records(
            [LayerOutput(p, op, v) for p, op, v in ref],
            [LayerOutput(p, op, v) for p, op, v in pins],
            tolerance,
            kind="gradients",
        ).rows
    }
    returned = {}
    for i, path in enumerate(done):
        returned.setdefault(path, i)
    rows = []
    for row in report.rows:
        owner = row.path.rsplit(".", 1)[0]
        reaching = [f for f in flips if f.position > returned.get(owner, len(done))]
        if reaching:
            row = dataclasses.replace(
                row, flips=flips_note(reaching), pinned=pinned_rows.get(row.path)
            )
        rows.append(row)
    return dataclasses.replace(report, rows=tuple(rows), decision_flips=summary)


def flips_note(flips: Sequence[FlipSite], limit: int = 3) -> str:
    """``flips: 3 at layer1.1.relu, 1 at maxpool``: the sites nearest the row first."""
    ordered = sorted(flips, key=lambda f: f.position)
    note = "flips: " + ", ".join(f"{f.count} at {f.site}" for f in ordered[:limit])
    if len(ordered) > limit:
        note += f" (+{len(ordered) - limit} more sites)"
    return note
