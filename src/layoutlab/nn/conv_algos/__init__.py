"""Selectable 2D convolution algorithms for CPU speed.

- ``conv2d(x, kernel, ..., algorithm="xla"|"im2col"|"winograd2"|"winograd4"|"pointwise"|
  "s2d"|"auto")``; ``nn.Conv(..., algorithm=...)`` calls it.
- ``"auto"`` runs the conv's entry in a ``ConvPlan`` (``conv_config.with_conv_plan``), which
  ``layoutlab.bench.tuning`` produces; a conv without one runs XLA's native conv.
- ``set_conv_algorithm(model, name)`` / ``set_kernel_storage(model, storage)``: per-model.
- Grouped, depthwise and dilated convs, and shapes an algorithm does not handle (Winograd:
  stride-1 3x3 only; pointwise: 1x1; s2d: stride 2), fall back to XLA's native conv;
  ``select_algorithm(spec, name)`` says what runs and why.
- Compute dtypes where an algorithm's error exceeds the dtype's bar are refused the same
  way (``winograd4*``: float32 only); ``unsupported_reason(name, dtype)`` says so up front.
"""

from layoutlab.nn.conv_algos import builtin as _builtin  # noqa: F401  (registers)
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
    Algorithm,
    algorithm_names,
    get_algorithm,
    register_algorithm,
    unregister_algorithm,
    unsupported_reason,
)

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
