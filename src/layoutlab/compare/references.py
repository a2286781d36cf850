"""Check a model against an independent reference with the same weights.

Four references, each giving a ``ReferenceReport`` (output, optionally every layer and every
parameter gradient):

- ``against_layout``: the same model converted to the other layout (``convert_layout``),
  computing in it with XLA's own convs;
- ``against_policy``: the same weights under the fp32 policy, with XLA's own convs, for a
  mixed-precision model;
  the per-layer table then shows where low-precision error accumulates with depth;
- ``against_numpy``: a float64 NumPy forward pass (``numpy_forward``), no JAX ops at all;
- ``against_torch`` (in ``torch_reference``): the PyTorch mirror of the architecture with the
  same weights.

Default tolerances scale with the least precise compute dtype of the two sides (see
``default_layer_tolerance``). The model under test runs as configured (conv algorithms and
plan, kernel and activation storage) and, given ``compiler_options``, compiled with them;
a JAX reference gets XLA's defaults. JAX runs with ``jax.default_matmul_precision("highest")`` and
PyTorch with TF32 off and ``float32_matmul_precision("highest")``; reports record both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np
from flax import nnx

from layoutlab.compare.decisions import FlipSite
from layoutlab.compare.flip_diagnosis import layers_layout, pinned_rerun
from layoutlab.compare.gradients import (
    compare_grad_trees,
    grads_to_layout,
    probed_parameter_grads,
)
from layoutlab.compare.layer_recording import LayerOutput, layer_outputs, model_layout, set_mode
from layoutlab.compare.layer_report import LayerTolerance
from layoutlab.compare.layerwise import (
    activation_report,
    describe,
    option_settings,
    run_settings,
)
from layoutlab.compare.reference_report import ReferenceReport
from layoutlab.layout import Layout, to_layout
from layoutlab.nn import conv_config
from layoutlab.nn.configuration import configure
from layoutlab.nn.convert import convert_layout
from layoutlab.precision import Policy, get_policy

__all__ = [
    "EPS_FACTOR",
    "FLOOR",
    "default_layer_tolerance",
    "model_policy",
    "with_policy",
    "default_labels",
    "GradientPair",
    "build_report",
    "against_layout",
    "against_policy",
    "against_numpy",
]


# Default per-layer tolerance: rtol = atol = max(EPS_FACTOR * eps, FLOOR) of the least precise
# compute dtype, atol relative to the layer's largest output (see LayerTolerance). Measured on
# the registry's models: mixed_bf16 and mixed_fp16 against fp32 stay under ~6 eps x max|y|
# per layer through ResNet-18 in train mode, so 16 eps (bf16: 0.125, fp16: 0.0156) passes
# correct half-precision runs and still flags an O(1) error. In float32, eps is too small to
# be the scale: two correct implementations differ mostly by summation order, amplified where
# train-mode BatchNorm divides by the std of few values (up to ~1e-4 x max|y| in the tiny
# ResNet-50 at 2x2 spatial), hence the floor. Degenerate batches (one or two values per
# channel in a BatchNorm) exceed any fixed tolerance: use more examples or eval mode.
EPS_FACTOR = 16.0
FLOOR = 3e-4


def default_layer_tolerance(
    *compute_dtypes: Any, factor: float = EPS_FACTOR, floor: float = FLOOR
) -> LayerTolerance:
    """``rtol = atol = max(factor * eps, floor)`` for the least precise of
    ``compute_dtypes``, ``atol`` times each layer's largest output (rounding error scales
    with the dtype and with the size of the values a layer sums)."""
    dtypes = [np.dtype(d) for d in compute_dtypes] or [np.dtype(np.float32)]
    eps = max(float(ml_dtypes.finfo(d).eps) for d in dtypes)
    tol = max(factor * eps, floor)
    return LayerTolerance(tol, tol, relative_to_max=True)


def model_policy(model: nnx.Module) -> Policy:
    policy = getattr(model, "policy", None)
    if isinstance(policy, Policy):
        return policy
    for _, node in nnx.iter_modules(model):
        if isinstance(getattr(node, "policy", None), Policy):
            return node.policy
    return get_policy(None)


def with_policy(model: nnx.Module, policy: Policy | str) -> nnx.Module:
    """A copy of ``model`` running under ``policy``, with the same weights (params cast to
    the policy's param dtype; batch statistics stay float32)."""
    policy = get_policy(policy)
    new = nnx.clone(model)
    for _, node in nnx.iter_modules(new):
        if isinstance(getattr(node, "policy", None), Policy):
            node.policy = policy
    for _, node in nnx.iter_graph(new):
        if isinstance(node, nnx.Param):
            node.set_value(node.get_value().astype(policy.param_dtype))
    return new


def default_labels(output: np.ndarray, layout: Layout, seed: int = 0) -> np.ndarray:
    """Fixed random integer labels for ``output``'s classes: ``(N,)`` for ``(N, K)`` logits,
    per pixel for per-pixel logits in ``layout``."""
    if output.ndim == 2:
        num_classes, shape = output.shape[1], output.shape[:1]
    else:
        num_classes = output.shape[layout.channel_axis]
        shape = tuple(s for a, s in enumerate(output.shape) if a != layout.channel_axis)
    return np.random.default_rng(seed).integers(0, num_classes, shape).astype(np.int32)


class GradientPair(NamedTuple):
    """Both sides' parameter gradients of one loss, as trees in the parameter layout of
    ``model``, whose paths name the rows; ``order`` is its layers' execution order.
    ``pinned``: the candidate's gradients rerun on the reference's ReLU/max-pool decisions
    (when any differ), ``flips`` where they differ, ``done`` the candidate's module calls
    in the order they returned (placing each flip among the layers); ``decisions`` says
    whether the two runs' decisions could be matched and how many differ; ``float32_check``
    the candidate's error left after pinning against float32's own (PyTorch only)."""

    model: nnx.Module
    reference: nnx.State
    candidate: nnx.State
    order: Sequence[str]
    reference_loss: float
    candidate_loss: float
    pinned: nnx.State | None = None
    flips: tuple[FlipSite, ...] = ()
    done: tuple[str, ...] = ()
    decisions: str = "matched"
    float32_check: str = ""


def build_report(
    against: str,
    ref: tuple[np.ndarray, list[LayerOutput]],
    cand: tuple[np.ndarray, list[LayerOutput]],
    tolerance: LayerTolerance,
    *,
    layerwise: bool,
    reference_layout: Layout,
    candidate_layout: Layout,
    names: tuple[str, str],
    settings: dict,
    labels: Any = None,
    gradients: Callable[[Any], GradientPair] | None = None,
) -> ReferenceReport:
    """The ``ReferenceReport`` of two ``(output, layer outputs)`` recordings and, with
    ``gradients`` (called with the labels, by default ``default_labels`` of the reference
    output), of both sides' parameter gradients."""
    output, layers = activation_report(
        ref,
        cand,
        tolerance,
        layerwise=layerwise,
        reference_layout=reference_layout,
        candidate_layout=candidate_layout,
        names=names,
        settings=settings,
    )
    grad_report = None
    if gradients is not None:
        if labels is None:
            labels = default_labels(ref[0], reference_layout)
        pair = gradients(labels)
        grad_report = compare_grad_trees(
            pair.model,
            pair.reference,
            pair.candidate,
            tolerance,
            order=pair.order,
            pinned=pair.pinned,
            flips=pair.flips,
            done=pair.done,
            reference_name=names[0],
            candidate_name=names[1],
            settings={
                **settings,
                "reference_loss": pair.reference_loss,
                "candidate_loss": pair.candidate_loss,
                "decisions": pair.decisions,
                **({"float32_check": pair.float32_check} if pair.float32_check else {}),
            },
        )
    return ReferenceReport(
        against, names[0], names[1], tolerance.describe(), output, layers, grad_report, settings
    )


def _xla_convs(reference: nnx.Module) -> nnx.Module:
    """``reference`` with every conv on XLA's own algorithm (a copy when one was not): a
    reference should not share the candidate's conv algorithms or plan."""
    native = {
        p: c.settings.native()
        for p, c in conv_config.convs(reference)
        if c.settings != c.settings.native()
    }
    return configure(reference, native) if native else reference


def _against_model(
    against: str,
    model: nnx.Module,
    reference: nnx.Module,
    x: Any,
    *,
    labels: Any,
    train: bool,
    layerwise: bool,
    grads: bool,
    tolerance: LayerTolerance | None,
    compiler_options: dict | None,
) -> ReferenceReport:
    """Compare ``model`` (the candidate, compiled with ``compiler_options``) with another
    JAX model of the same architecture (compiled with XLA's defaults)."""
    cand_layout, ref_layout = model_layout(model), model_layout(reference)
    if tolerance is None:
        tolerance = default_layer_tolerance(
            model_policy(model).compute_dtype, model_policy(reference).compute_dtype
        )
    x = np.asarray(x)
    x_ref = np.asarray(to_layout(x, cand_layout, ref_layout))

    def gradients(labels: Any) -> GradientPair:
        ref = probed_parameter_grads(reference, x_ref, labels, train=train)
        run = probed_parameter_grads(
            model, x, labels, train=train, compiler_options=compiler_options
        )
        return GradientPair(
            reference,
            ref.grads,
            grads_to_layout(model, run.grads, ref_layout),
            ref.order,
            ref.loss,
            run.loss,
            **pinned_rerun(
                model,
                x,
                labels,
                train,
                compiler_options,
                ref.decisions,
                run,
                layers_layout(reference),
                ref_layout,
            ),
        )

    return build_report(
        against,
        layer_outputs(reference, x_ref, train=train),
        layer_outputs(model, x, train=train, compiler_options=compiler_options),
        tolerance,
        layerwise=layerwise,
        reference_layout=ref_layout,
        candidate_layout=cand_layout,
        names=(describe(reference), describe(model)),
        settings=run_settings(train, **option_settings(compiler_options)),
        labels=labels,
        gradients=gradients if grads else None,
    )


def against_layout(
    model: nnx.Module,
    x: Any,
    *,
    labels: Any = None,
    train: bool = False,
    layerwise: bool = False,
    grads: bool = False,
    tolerance: LayerTolerance | None = None,
    compiler_options: dict | None = None,
) -> ReferenceReport:
    """``model`` against itself converted to the other layout (same weights, same policy),
    which computes in that layout with XLA's own convs. ``x`` is in ``model``'s layout."""
    reference = _xla_convs(convert_layout(model, model_layout(model).counterpart))
    return _against_model(
        "layout",
        model,
        reference,
        x,
        labels=labels,
        train=train,
        layerwise=layerwise,
        grads=grads,
        tolerance=tolerance,
        compiler_options=compiler_options,
    )


def against_policy(
    model: nnx.Module,
    x: Any,
    *,
    reference_policy: Policy | str = "fp32",
    labels: Any = None,
    train: bool = False,
    layerwise: bool = False,
    grads: bool = False,
    tolerance: LayerTolerance | None = None,
    compiler_options: dict | None = None,
) -> ReferenceReport:
    """A mixed-precision ``model`` against the same weights under ``reference_policy``.

    The default tolerance scales with ``model``'s compute dtype; with ``layerwise`` the
    report's ``depth_profile()`` shows how the error grows layer after layer.

    Gradients (``grads=True``) of a half-precision model usually exceed that tolerance even
    when nothing is wrong: at initialization the early layers' gradients are ill-conditioned
    (in ResNet-18, a 1e-3 relative change of the input moves them by ~15%), so bfloat16's
    ~1% forward error legitimately moves them by tens of percent. Judge half-precision
    training with ``layoutlab.compare.curves`` instead, or pass a tolerance of that size.
    """
    reference = _xla_convs(with_policy(model, reference_policy))
    return _against_model(
        "fp32" if get_policy(reference_policy) == get_policy("fp32") else "policy",
        model,
        reference,
        x,
        labels=labels,
        train=train,
        layerwise=layerwise,
        grads=grads,
        tolerance=tolerance,
        compiler_options=compiler_options,
    )


def against_numpy(
    model: nnx.Module,
    x: Any,
    *,
    train: bool = False,
    layerwise: bool = False,
    tolerance: LayerTolerance | None = None,
    compiler_options: dict | None = None,
) -> ReferenceReport:
    """``model`` against a float64 NumPy forward pass with its weights (no JAX involved)."""
    from layoutlab.compare.numpy_forward import numpy_forward

    layout = model_layout(model)
    if tolerance is None:
        tolerance = default_layer_tolerance(model_policy(model).compute_dtype)
    x = np.asarray(x)
    ref = numpy_forward(set_mode(model, train), x, train=train)
    return build_report(
        "numpy",
        ref,
        layer_outputs(model, x, train=train, compiler_options=compiler_options),
        tolerance,
        layerwise=layerwise,
        reference_layout=layout,
        candidate_layout=layout,
        names=("float64 NumPy (numpy_ref)", describe(model)),
        settings=run_settings(train, **option_settings(compiler_options)),
    )
