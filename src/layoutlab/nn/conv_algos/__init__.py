"""Selectable 2D convolution algorithms for CPU speed.

- ``conv2d(x, kernel, ..., algorithm="xla"|"im2col"|"winograd2"|"winograd4"|"pointwise"|
  "s2d"|"auto")``; ``nn.Conv(..., algorithm=...)`` calls it.
- ``"auto"`` reads the process-wide choice table (``set_choice``/``load_choices``), which
  ``layoutlab.bench.conv_autotune`` fills; missing entries run XLA's native conv.
- ``force_conv_algorithm(name)``: a ``with`` block overriding every conv traced inside.
- ``set_conv_algorithm(model, name)`` / ``set_kernel_storage(model, storage)``: per-model.
- Grouped, depthwise and dilated convs, and shapes an algorithm does not handle (Winograd:
  stride-1 3x3 only; pointwise: 1x1; s2d: stride 2), fall back to XLA's native conv;
  ``select_algorithm(spec, name)`` says what runs and why.
- Compute dtypes where an algorithm's error exceeds the dtype's bar are refused the same
  way (``winograd4*``: float32 only); ``unsupported_reason(name, dtype)`` says so up front.
"""

from layoutlab.nn.conv_algos import builtin as _builtin  # noqa: F401  (registers)
from layoutlab.nn.conv_algos.choices import (
    CACHE_ENV,
    CACHE_FORMAT,
    choices,
    clear_choices,
    default_cache_path,
    force_conv_algorithm,
    get_choice,
    load_choices,
    set_choice,
    update_choices,
    versions,
)
from layoutlab.nn.conv_algos.dispatch import (
    Selection,
    conv2d,
    conv_spec,
    record_conv_specs,
    select_algorithm,
)
from layoutlab.nn.conv_algos.geometry import ConvSpec, Geometry, resolve_geometry
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
    "CACHE_ENV",
    "CACHE_FORMAT",
    "XLA",
    "Algorithm",
    "ConvSpec",
    "Geometry",
    "Selection",
    "algorithm_names",
    "choices",
    "clear_choices",
    "conv2d",
    "conv_spec",
    "default_cache_path",
    "force_conv_algorithm",
    "get_algorithm",
    "get_choice",
    "load_choices",
    "record_conv_specs",
    "register_algorithm",
    "resolve_geometry",
    "select_algorithm",
    "set_choice",
    "unregister_algorithm",
    "unsupported_reason",
    "update_choices",
    "versions",
]
