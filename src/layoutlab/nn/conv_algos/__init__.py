"""Selectable 2D convolution algorithms for CPU speed.

- ``conv2d(x, kernel, ..., algorithm="xla"|"im2col"|"winograd2"|"winograd4"|"pointwise"|
  "s2d"|"depthwise"|"auto")``; ``nn.Conv(..., algorithm=...)`` calls it.
- ``"auto"`` runs the conv's entry in a ``ConvPlan`` (``nn.configure(model, plan)``), which
  ``layoutlab.bench.tuning`` produces; a conv without one runs XLA's native conv.
- ``nn.configure(model, nn.ConvSettings.named(name))``: a copy of a model running ``name``.
- Grouped and dilated convs, and shapes an algorithm does not handle (Winograd: stride-1
  3x3 only; pointwise: 1x1; s2d: stride 2; depthwise: depthwise only), fall back to XLA's
  native conv;
  ``select_algorithm(spec, name)`` says what runs and why.
- Compute dtypes where an algorithm's error exceeds the dtype's bar are refused the same
  way (``winograd4*``: float32 only); ``unsupported_reason(name, dtype)`` says so up front.


Names load lazily (``layoutlab.lazy``), so importing the package, as the CLI does
to build its parser, imports no JAX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from layoutlab.lazy import lazy_exports

if TYPE_CHECKING:
    from layoutlab.nn.conv_algos.algorithm import Algorithm
    from layoutlab.nn.conv_algos.dispatch import (
        Selection,
        conv2d,
        conv_spec,
        planned_algorithm,
        select_algorithm,
    )
    from layoutlab.nn.conv_algos.geometry import ConvSpec, Geometry, resolve_geometry
    from layoutlab.nn.conv_algos.plan import PLAN_FORMAT, ConvPlan, PlanEntry, as_plan, load_plan
    from layoutlab.nn.conv_algos.registry import (
        AUTO,
        XLA,
        algorithm_names,
        algorithm_values,
        get_algorithm,
        register_algorithm,
        unregister_algorithm,
        unsupported_reason,
    )

_EXPORTS = {
    "Selection": "dispatch",
    "conv2d": "dispatch",
    "conv_spec": "dispatch",
    "planned_algorithm": "dispatch",
    "select_algorithm": "dispatch",
    "ConvSpec": "geometry",
    "Geometry": "geometry",
    "resolve_geometry": "geometry",
    "PLAN_FORMAT": "plan",
    "ConvPlan": "plan",
    "PlanEntry": "plan",
    "as_plan": "plan",
    "load_plan": "plan",
    "AUTO": "registry",
    "XLA": "registry",
    "Algorithm": "algorithm",
    "algorithm_names": "registry",
    "algorithm_values": "registry",
    "get_algorithm": "registry",
    "register_algorithm": "registry",
    "unregister_algorithm": "registry",
    "unsupported_reason": "registry",
}

__all__ = [
    "AUTO",
    "PLAN_FORMAT",
    "XLA",
    "Algorithm",
    "ConvPlan",
    "ConvSpec",
    "Geometry",
    "PlanEntry",
    "Selection",
    "algorithm_names",
    "algorithm_values",
    "as_plan",
    "conv2d",
    "conv_spec",
    "get_algorithm",
    "load_plan",
    "planned_algorithm",
    "register_algorithm",
    "resolve_geometry",
    "select_algorithm",
    "unregister_algorithm",
    "unsupported_reason",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, lambda: set(globals()))
