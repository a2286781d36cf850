"""Check a model against its PyTorch mirror holding the same weights, output, every layer
and every parameter gradient. Needs the optional PyTorch extra (imported on first use)."""

from __future__ import annotations

from typing import Any

import numpy as np
from flax import nnx

from layoutlab.compare.gradients import probed_parameter_grads
from layoutlab.compare.layer_recording import layer_outputs, model_layout, set_mode
from layoutlab.compare.layer_report import LayerTolerance
from layoutlab.compare.layerwise import describe, option_settings, run_settings
from layoutlab.compare.reference_report import ReferenceReport
from layoutlab.compare.references import (
    GradientPair,
    build_report,
    default_layer_tolerance,
    model_policy,
    pinned_rerun,
)
from layoutlab.layout import Layout, channels_first, to_layout

__all__ = ["against_torch", "torch_mirror_of"]


def torch_mirror_of(model: nnx.Module, name: str, *, num_classes: int, **model_kwargs):
    """The PyTorch mirror of registry model ``name`` holding ``model``'s weights."""
    from layoutlab.compare.torch_mirrors import build_torch_mirror
    from layoutlab.compare.torch_weights import to_torch_state_dict

    mirror = build_torch_mirror(name, num_classes=num_classes, **model_kwargs)
    mirror.load_state_dict(to_torch_state_dict(model, tensors=True))
    return mirror


def _num_classes(output: np.ndarray, layout: Layout) -> int:
    return int(output.shape[-1] if output.ndim == 2 else output.shape[layout.channel_axis])


def _float32_check(model: nnx.Module, train: bool, grads: nnx.State, exact: dict) -> dict | None:
    """The candidate's gradients (as run, or pinned where decisions differ) under the float64
    reference's names and in its layout, for a float32 candidate (None otherwise: float32's
    own error is no yardstick for a half-precision one)."""
    from layoutlab.compare.torch_weights import to_torch_state_dict

    if np.dtype(model_policy(model).compute_dtype) != np.float32:
        return None
    holder = set_mode(model, train)
    nnx.update(holder, grads)
    named = to_torch_state_dict(holder)
    return {k: named[k] for k in exact}


def against_torch(
    model: nnx.Module,
    x: Any,
    *,
    mirror: Any = None,
    name: str | None = None,
    model_kwargs: dict | None = None,
    labels: Any = None,
    train: bool = False,
    layerwise: bool = False,
    grads: bool = False,
    tolerance: LayerTolerance | None = None,
    compiler_options: dict | None = None,
) -> ReferenceReport:
    """``model`` against its PyTorch mirror with the same weights.

    Give ``mirror`` (a ``torch.nn.Module`` holding the same weights) or the registry
    ``name`` and the ``model_kwargs`` ``model`` was created with. ``x`` is in ``model``'s
    layout; the torch side runs channels-first and every activation is compared there.
    Gradients are compared in ``model``'s parameter layout. ``compiler_options``: XLA
    options of the model's compiles.
    """
    from layoutlab.compare.torch_decisions import torch_decisions, torch_float64_grads
    from layoutlab.compare.torch_float32_floor import (
        float32_verdict,
        pinned_float32_grads,
        rel_l2_errors,
    )
    from layoutlab.compare.torch_layerwise import TORCH_PRECISION, torch_layer_outputs
    from layoutlab.compare.torch_weights import load_torch_state_dict, to_torch_state_dict

    if mirror is None and name is None:
        raise ValueError("against_torch needs a torch mirror or the registry model name.")
    layout = model_layout(model)
    ref_layout = channels_first(layout.num_spatial)
    if tolerance is None:
        tolerance = default_layer_tolerance(model_policy(model).compute_dtype)
    x = np.asarray(x)
    x_ref = np.asarray(to_layout(x, layout, ref_layout))
    settings = run_settings(train, **TORCH_PRECISION, **option_settings(compiler_options))
    cand = layer_outputs(model, x, train=train, compiler_options=compiler_options)
    if mirror is None:
        kwargs = dict(model_kwargs or {})
        kwargs.setdefault("num_classes", _num_classes(cand[0], layout))
        mirror = torch_mirror_of(model, name, **kwargs)
    ref = torch_layer_outputs(mirror, x_ref, train=train)

    def gradients(labels: Any) -> GradientPair:
        # The reference is the mirror in float64: its gradients and its ReLU/max-pool
        # decisions are the exact ones, against which the candidate's flips are counted.
        ref_decisions, mirror64, _ = torch_decisions(mirror, x_ref, train)
        ref_loss, exact = torch_float64_grads(mirror64, x_ref, labels, train=train)
        named = {k: v.astype(np.float32) for k, v in exact.items()}  # for the importer
        run = probed_parameter_grads(
            model, x, labels, train=train, compiler_options=compiler_options
        )
        # Torch gradients go through the weight importer, which puts each one in the
        # model's own parameter layout.
        holder = set_mode(model, train)
        load_torch_state_dict(holder, {**to_torch_state_dict(holder), **named})
        ref_grads = nnx.state(holder, nnx.Param)
        diagnosis = pinned_rerun(
            model, x, labels, train, compiler_options, ref_decisions, run, ref_layout
        )
        diagnosis["decisions"] += "; the reference's gradients and decisions in float64"
        check = _float32_check(model, train, diagnosis.get("pinned", run.grads), exact)
        own = check and pinned_float32_grads(mirror, x_ref, labels, train, ref_decisions)
        if own:
            diagnosis["float32_check"] = float32_verdict(
                rel_l2_errors(check, exact), rel_l2_errors(own, exact)
            )["text"]
        return GradientPair(model, ref_grads, run.grads, run.order, ref_loss, run.loss, **diagnosis)

    return build_report(
        "torch",
        ref,
        cand,
        tolerance,
        layerwise=layerwise,
        reference_layout=ref_layout,
        candidate_layout=layout,
        names=(f"PyTorch {type(mirror).__name__} {ref_layout.value} float32", describe(model)),
        settings=settings,
        labels=labels,
        gradients=gradients if grads else None,
    )
