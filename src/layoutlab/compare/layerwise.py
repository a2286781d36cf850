"""Layer-by-layer comparison of two runs of one architecture: every layer's output in
execution order, naming the first layer out of tolerance, which is where the divergence
starts. Recording lives in ``layer_recording``, the per-layer report in ``layer_report``,
gradients in ``gradients``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flax import nnx

from layoutlab.compare.layer_recording import (
    MATMUL_PRECISION,
    LayerOutput,
    layer_outputs,
    model_layout,
)
from layoutlab.compare.layer_report import (
    LayerTolerance,
    LayerwiseReport,
    compare_records,
    to_reference_layout,
)
from layoutlab.compare.report import CompareReport
from layoutlab.layout import Layout

__all__ = [
    "describe",
    "run_settings",
    "option_settings",
    "activation_report",
    "compare_layerwise",
]


def describe(model: nnx.Module) -> str:
    """``"ResNet NHWC params=float32,compute=float32,output=float32"``."""
    policy = getattr(model, "policy", None)
    return f"{type(model).__name__} {model_layout(model).value}" + (f" {policy}" if policy else "")


def run_settings(train: bool, **extra) -> dict:
    """The settings a report records: train or eval mode and JAX's matmul precision."""
    return {"mode": "train" if train else "eval", "jax_matmul_precision": MATMUL_PRECISION, **extra}


def option_settings(compiler_options: dict | None) -> dict:
    """``{"candidate_xla_options": ...}`` when the candidate was compiled with XLA options."""
    return {"candidate_xla_options": dict(compiler_options)} if compiler_options else {}


def activation_report(
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
    """``(output report, per-layer report or None)`` of two ``(output, layer outputs)``
    recordings; the model output closes the per-layer table, so a divergence after the last
    layer shows too."""
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


def compare_layerwise(
    reference: nnx.Module,
    candidate: nnx.Module,
    x: Any,
    tolerance: LayerTolerance,
    *,
    train: bool = False,
    include_containers: bool = False,
    reference_name: str | None = None,
    candidate_name: str | None = None,
    compiler_options: dict | None = None,
) -> LayerwiseReport:
    """Run two configurations of one architecture on ``x`` (in the reference's layout) and
    compare every layer's output, the candidate's moved to the reference's layout.
    ``compiler_options``: XLA options of both sides' compiles, as ``layoutlab compare``'s
    ``--xla-option`` (e.g. ``fast_defaults.fast_compile_options``)."""
    ref_layout, cand_layout = model_layout(reference), model_layout(candidate)
    kw = dict(train=train, include_containers=include_containers, compiler_options=compiler_options)
    ref = layer_outputs(reference, x, **kw)
    x_cand = to_reference_layout(np.asarray(x), ref_layout, cand_layout)
    cand = layer_outputs(candidate, x_cand, **kw)
    _, report = activation_report(
        ref,
        cand,
        tolerance,
        layerwise=True,
        reference_layout=ref_layout,
        candidate_layout=cand_layout,
        names=(reference_name or describe(reference), candidate_name or describe(candidate)),
        settings=run_settings(train),
    )
    return report
