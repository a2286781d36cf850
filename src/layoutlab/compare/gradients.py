"""Per-parameter gradient comparison of two runs of one architecture, in backprop order:
a bug in one layer's backward leaves the layers after it intact, so the first failing row
names it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from layoutlab.compare.layer_recording import (
    MATMUL_PRECISION,
    LayerOutput,
    canonical_path,
    highest_precision,
    model_layout,
    module_table,
    record_layers,
    set_mode,
)
from layoutlab.compare.layer_report import (
    LayerTolerance,
    LayerwiseReport,
    compare_records,
    to_reference_layout,
)
from layoutlab.compare.layerwise import describe
from layoutlab.layout import Layout
from layoutlab.nn.convert import convert_layout

__all__ = [
    "loss_fn",
    "parameter_grads",
    "grads_to_layout",
    "compare_grad_trees",
    "compare_gradients",
]


def loss_fn(logits: jax.Array, labels: jax.Array, layout: Layout) -> jax.Array:
    """Mean softmax cross-entropy in float32; per-pixel logits have their class axis moved
    last first, so classification and segmentation models share one loss."""
    logits = logits.astype(jnp.float32)
    if logits.ndim == layout.rank:
        logits = jnp.moveaxis(logits, layout.channel_axis, -1)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


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
    model = set_mode(model, train)
    layout = model_layout(model)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    order: list[str] = []

    def loss(params, rest, x, labels):
        m = nnx.merge(graphdef, params, rest, copy=True)
        logits, records = record_layers(m, x)
        order[:] = [r.path for r in records]
        return loss_fn(logits, labels, layout)

    with highest_precision():
        grad_fn = jax.jit(jax.value_and_grad(loss), compiler_options=compiler_options or None)
        value, grads = grad_fn(params, rest, x, labels)
    return float(value), grads, order


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
    reference_name: str = "reference",
    candidate_name: str = "candidate",
    settings: dict | None = None,
) -> LayerwiseReport:
    """Compare two gradient trees already in the reference model's layout, row by row in
    backprop order (``backward``; ``order`` is the layers' execution order), so the first
    failing row is where the backward pass starts to diverge."""
    ref = _grad_rows_order(reference_model, reference_grads, order, backward)
    cand = _grad_rows_order(reference_model, candidate_grads, order, backward)
    return compare_records(
        [LayerOutput(p, op, v) for p, op, v in ref],
        [LayerOutput(p, op, v) for p, op, v in cand],
        tolerance,
        kind="gradients",
        reference_name=reference_name,
        candidate_name=candidate_name,
        settings={"order": "backprop" if backward else "execution", **(settings or {})},
    )


def compare_gradients(
    reference: nnx.Module,
    candidate: nnx.Module,
    x: Any,
    labels: Any,
    tolerance: LayerTolerance,
    *,
    train: bool = True,
    reference_name: str | None = None,
    candidate_name: str | None = None,
) -> LayerwiseReport:
    """Gradients of every parameter of two configurations w.r.t. the same loss, the
    candidate's conv kernels moved to the reference's layout, in backprop order.

    A bug in one layer's forward changes every gradient (the activations after it change),
    so look for it in ``compare_layerwise``; a bug in one layer's backward leaves the layers
    after it intact, and the first failing row here names it."""
    ref_layout, cand_layout = model_layout(reference), model_layout(candidate)
    ref_loss, ref_grads, order = parameter_grads(reference, x, labels, train=train)
    x_cand = to_reference_layout(np.asarray(x), ref_layout, cand_layout)
    cand_loss, cand_grads, _ = parameter_grads(candidate, x_cand, labels, train=train)
    cand_grads = grads_to_layout(candidate, cand_grads, ref_layout)
    return compare_grad_trees(
        reference,
        ref_grads,
        cand_grads,
        tolerance,
        order=order,
        reference_name=reference_name or describe(reference),
        candidate_name=candidate_name or describe(candidate),
        settings={
            "mode": "train" if train else "eval",
            "loss": "mean softmax cross-entropy, fixed labels",
            "reference_loss": ref_loss,
            "candidate_loss": cand_loss,
            "jax_matmul_precision": MATMUL_PRECISION,
        },
    )
