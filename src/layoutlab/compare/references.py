"""Check a model against an independent reference with the same weights.

Four references, each giving a ``ReferenceReport`` (output, optionally every layer and every
parameter gradient):

- ``against_layout``: the same model converted to the other layout (``convert_layout``);
- ``against_policy``: the same weights under the fp32 policy, for a mixed-precision model;
  the per-layer table then shows where low-precision error accumulates with depth;
- ``against_numpy``: a float64 NumPy forward pass (``numpy_forward``), no JAX ops at all;
- ``against_torch``: the PyTorch mirror of the architecture with the same weights.

Default tolerances scale with the least precise compute dtype of the two sides (see
``default_layer_tolerance``). JAX runs with ``jax.default_matmul_precision("highest")`` and
PyTorch with TF32 off and ``float32_matmul_precision("highest")``; reports record both.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import ml_dtypes
import numpy as np
from flax import nnx

from layoutlab.compare.layerwise import (
    MATMUL_PRECISION,
    LayerOutput,
    LayerTolerance,
    LayerwiseReport,
    compare_grad_trees,
    compare_records,
    describe,
    grads_to_layout,
    layer_outputs,
    model_layout,
    parameter_grads,
    set_mode,
)
from layoutlab.compare.report import CompareReport
from layoutlab.layout import Layout, channels_first, to_layout
from layoutlab.nn.convert import convert_layout
from layoutlab.precision import Policy, get_policy

__all__ = [
    "EPS_FACTOR",
    "FLOOR",
    "ReferenceReport",
    "default_layer_tolerance",
    "model_policy",
    "with_policy",
    "default_labels",
    "against_layout",
    "against_policy",
    "against_numpy",
    "against_torch",
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


@dataclasses.dataclass(frozen=True)
class ReferenceReport:
    """A model checked against one reference: the output, and optionally every layer's
    output and every parameter's gradient."""

    against: str
    reference: str
    candidate: str
    tolerance: str
    output: CompareReport
    layers: LayerwiseReport | None = None
    grads: LayerwiseReport | None = None
    settings: dict = dataclasses.field(default_factory=dict)

    @property
    def passed(self) -> bool:
        parts = [self.output.passed]
        parts += [p.passed for p in (self.layers, self.grads) if p is not None]
        return all(parts)

    def depth_profile(self) -> list[dict]:
        """Error per depth (execution index of each layer); empty without layers."""
        return self.layers.depth_profile() if self.layers is not None else []

    def __str__(self) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        lines = [
            f"compare against {self.against}: {verdict}",
            f"  candidate: {self.candidate}",
            f"  reference: {self.reference}",
            f"  tolerance: {self.tolerance}",
        ]
        lines += [f"  {k}: {v}" for k, v in self.settings.items()]
        lines += ["", str(self.output)]
        for part in (self.layers, self.grads):
            if part is not None:
                lines += ["", str(part)]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "against": self.against,
            "reference": self.reference,
            "candidate": self.candidate,
            "tolerance": self.tolerance,
            "passed": self.passed,
            "settings": json.loads(json.dumps(self.settings, default=str)),
            "output": self.output.to_dict(),
            "layers": self.layers.to_dict() if self.layers is not None else None,
            "grads": self.grads.to_dict() if self.grads is not None else None,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReferenceReport:
        def part(d):
            return LayerwiseReport.from_dict(d) if d is not None else None

        return cls(
            against=data["against"],
            reference=data["reference"],
            candidate=data["candidate"],
            tolerance=data["tolerance"],
            output=CompareReport.from_dict(data["output"]),
            layers=part(data.get("layers")),
            grads=part(data.get("grads")),
            settings=dict(data.get("settings", {})),
        )


def _activation_report(
    ref: tuple[np.ndarray, list[LayerOutput]],
    cand: tuple[np.ndarray, list[LayerOutput]],
    tolerance: LayerTolerance,
    *,
    layerwise: bool,
    reference_layout: Layout,
    candidate_layout: Layout,
    names: tuple[str, str],
    settings: dict,
) -> tuple[CompareReport, LayerwiseReport | None]:
    ref_records = list(ref[1]) if layerwise else []
    cand_records = list(cand[1]) if layerwise else []
    ref_records.append(LayerOutput("(output)", "output", ref[0]))
    cand_records.append(LayerOutput("(output)", "output", cand[0]))
    report = compare_records(
        ref_records,
        cand_records,
        tolerance,
        reference_layout=reference_layout,
        candidate_layout=candidate_layout,
        reference_name=names[0],
        candidate_name=names[1],
        settings=settings,
    )
    return report.rows[-1].report, (report if layerwise else None)


def _settings(train: bool, **extra) -> dict:
    return {"mode": "train" if train else "eval", "jax_matmul_precision": MATMUL_PRECISION, **extra}


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
) -> ReferenceReport:
    """Compare ``model`` (the candidate) with another JAX model of the same architecture."""
    cand_layout, ref_layout = model_layout(model), model_layout(reference)
    if tolerance is None:
        tolerance = default_layer_tolerance(
            model_policy(model).compute_dtype, model_policy(reference).compute_dtype
        )
    x = np.asarray(x)
    x_ref = np.asarray(to_layout(x, cand_layout, ref_layout))
    names = (describe(reference), describe(model))
    settings = _settings(train)
    ref = layer_outputs(reference, x_ref, train=train)
    cand = layer_outputs(model, x, train=train)
    output, layers = _activation_report(
        ref,
        cand,
        tolerance,
        layerwise=layerwise,
        reference_layout=ref_layout,
        candidate_layout=cand_layout,
        names=names,
        settings=settings,
    )
    grad_report = None
    if grads:
        if labels is None:
            labels = default_labels(ref[0], ref_layout)
        ref_loss, ref_grads, order = parameter_grads(reference, x_ref, labels, train=train)
        cand_loss, cand_grads, _ = parameter_grads(model, x, labels, train=train)
        grad_report = compare_grad_trees(
            reference,
            ref_grads,
            grads_to_layout(model, cand_grads, ref_layout),
            tolerance,
            order=order,
            reference_name=names[0],
            candidate_name=names[1],
            settings={**settings, "reference_loss": ref_loss, "candidate_loss": cand_loss},
        )
    return ReferenceReport(
        against=against,
        reference=names[0],
        candidate=names[1],
        tolerance=tolerance.describe(),
        output=output,
        layers=layers,
        grads=grad_report,
        settings=settings,
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
) -> ReferenceReport:
    """``model`` against itself converted to the other layout (same weights, same policy).
    ``x`` is in ``model``'s layout."""
    reference = convert_layout(model, model_layout(model).counterpart)
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
    reference = with_policy(model, reference_policy)
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
    )


def against_numpy(
    model: nnx.Module,
    x: Any,
    *,
    train: bool = False,
    layerwise: bool = False,
    tolerance: LayerTolerance | None = None,
) -> ReferenceReport:
    """``model`` against a float64 NumPy forward pass with its weights (no JAX involved)."""
    from layoutlab.compare.numpy_forward import numpy_forward

    layout = model_layout(model)
    if tolerance is None:
        tolerance = default_layer_tolerance(model_policy(model).compute_dtype)
    x = np.asarray(x)
    ref = numpy_forward(set_mode(model, train), x, train=train)
    cand = layer_outputs(model, x, train=train)
    names = ("float64 NumPy (numpy_ref)", describe(model))
    settings = _settings(train)
    output, layers = _activation_report(
        ref,
        cand,
        tolerance,
        layerwise=layerwise,
        reference_layout=layout,
        candidate_layout=layout,
        names=names,
        settings=settings,
    )
    return ReferenceReport(
        "numpy", names[0], names[1], tolerance.describe(), output, layers, None, settings
    )


def torch_mirror_of(model: nnx.Module, name: str, *, num_classes: int, **model_kwargs):
    """The PyTorch mirror of registry model ``name`` holding ``model``'s weights."""
    from layoutlab.compare.torch_mirrors import build_torch_mirror
    from layoutlab.compare.torch_weights import to_torch_state_dict

    mirror = build_torch_mirror(name, num_classes=num_classes, **model_kwargs)
    mirror.load_state_dict(to_torch_state_dict(model, tensors=True))
    return mirror


def _num_classes(output: np.ndarray, layout: Layout) -> int:
    return int(output.shape[-1] if output.ndim == 2 else output.shape[layout.channel_axis])


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
) -> ReferenceReport:
    """``model`` against its PyTorch mirror with the same weights.

    Give ``mirror`` (a ``torch.nn.Module`` holding the same weights) or the registry
    ``name`` and the ``model_kwargs`` ``model`` was created with. ``x`` is in ``model``'s
    layout; the torch side runs channels-first and every activation is compared there.
    Gradients are compared in ``model``'s parameter layout.
    """
    from layoutlab.compare.torch_mirrors import (
        TORCH_PRECISION,
        torch_grads,
        torch_layer_outputs,
    )
    from layoutlab.compare.torch_weights import load_torch_state_dict, to_torch_state_dict

    if mirror is None and name is None:
        raise ValueError("against_torch needs a torch mirror or the registry model name.")
    layout = model_layout(model)
    ref_layout = channels_first(layout.num_spatial)
    if tolerance is None:
        tolerance = default_layer_tolerance(model_policy(model).compute_dtype)
    x = np.asarray(x)
    x_ref = np.asarray(to_layout(x, layout, ref_layout))
    settings = _settings(train, **TORCH_PRECISION)
    cand = layer_outputs(model, x, train=train)
    if mirror is None:
        kwargs = dict(model_kwargs or {})
        kwargs.setdefault("num_classes", _num_classes(cand[0], layout))
        mirror = torch_mirror_of(model, name, **kwargs)
    ref = torch_layer_outputs(mirror, x_ref, train=train)
    names = (f"PyTorch {type(mirror).__name__} {ref_layout.value} float32", describe(model))
    output, layers = _activation_report(
        ref,
        cand,
        tolerance,
        layerwise=layerwise,
        reference_layout=ref_layout,
        candidate_layout=layout,
        names=names,
        settings=settings,
    )
    grad_report = None
    if grads:
        if labels is None:
            labels = default_labels(ref[0], ref_layout)
        ref_loss, named = torch_grads(mirror, x_ref, labels, train=train)
        cand_loss, cand_grads, order = parameter_grads(model, x, labels, train=train)
        # Torch gradients go through the weight importer, which puts each one in the
        # model's own parameter layout.
        holder = set_mode(model, train)
        load_torch_state_dict(holder, {**to_torch_state_dict(holder), **named})
        grad_report = compare_grad_trees(
            model,
            nnx.state(holder, nnx.Param),
            cand_grads,
            tolerance,
            order=order,
            reference_name=names[0],
            candidate_name=names[1],
            settings={**settings, "reference_loss": ref_loss, "candidate_loss": cand_loss},
        )
    return ReferenceReport(
        "torch", names[0], names[1], tolerance.describe(), output, layers, grad_report, settings
    )
