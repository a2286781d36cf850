"""``compare_gradients``: the per-parameter gradient comparison of two configurations, with
the reference's ReLU and max-pool decisions replayed where they flipped
(``flip_diagnosis``), so a flip is told apart from a defect."""

from __future__ import annotations

from typing import Any

import numpy as np
from flax import nnx

from layoutlab.compare.flip_diagnosis import layers_layout, pinned_rerun
from layoutlab.compare.gradients import (
    compare_grad_trees,
    grads_to_layout,
    probed_parameter_grads,
)
from layoutlab.compare.layer_recording import MATMUL_PRECISION, model_layout
from layoutlab.compare.layer_report import LayerTolerance, LayerwiseReport, to_reference_layout
from layoutlab.compare.layerwise import describe

__all__ = ["compare_gradients"]


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
    ref = probed_parameter_grads(reference, x, labels, train=train)
    x_cand = to_reference_layout(np.asarray(x), ref_layout, cand_layout)
    run = probed_parameter_grads(candidate, x_cand, labels, train=train)
    diagnosis = pinned_rerun(
        candidate,
        x_cand,
        labels,
        train,
        None,
        ref.decisions,
        run,
        layers_layout(reference),
        ref_layout,
    )
    ref_loss, cand_loss = ref.loss, run.loss
    return compare_grad_trees(
        reference,
        ref.grads,
        grads_to_layout(candidate, run.grads, ref_layout),
        tolerance,
        order=ref.order,
        pinned=diagnosis.get("pinned"),
        flips=diagnosis.get("flips", ()),
        done=diagnosis.get("done"),
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
