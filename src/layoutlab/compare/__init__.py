"""Numerics comparison: dtype-aware tolerances, array and pytree reports, float64 references.

Names are imported lazily so that ``import layoutlab.compare`` stays light; the float64 NumPy
reference ops live in ``layoutlab.compare.numpy_ref``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from layoutlab.compare import numpy_ref
    from layoutlab.compare.curves import compare_curves, compare_training
    from layoutlab.compare.gradient_comparison import compare_gradients
    from layoutlab.compare.layer_report import LayerTolerance
    from layoutlab.compare.layerwise import compare_layerwise
    from layoutlab.compare.references import (
        against_layout,
        against_numpy,
        against_policy,
        with_policy,
    )
    from layoutlab.compare.report import CompareReport, ShapeMismatchError, assert_close, compare
    from layoutlab.compare.tolerance import Tolerance, default_tolerance, scaled
    from layoutlab.compare.torch_mirrors import build_torch_mirror
    from layoutlab.compare.torch_reference import against_torch
    from layoutlab.compare.torch_weights import load_torch_state_dict, to_torch_state_dict
    from layoutlab.compare.tree import (
        TreeReport,
        TreeStructureError,
        assert_trees_close,
        compare_trees,
    )

_EXPORTS = {
    "Tolerance": "tolerance",
    "default_tolerance": "tolerance",
    "scaled": "tolerance",
    "CompareReport": "report",
    "ShapeMismatchError": "report",
    "compare": "report",
    "assert_close": "report",
    "TreeReport": "tree",
    "TreeStructureError": "tree",
    "compare_trees": "tree",
    "assert_trees_close": "tree",
    "LayerTolerance": "layer_report",
    "compare_gradients": "gradient_comparison",
    "compare_layerwise": "layerwise",
    "against_layout": "references",
    "against_numpy": "references",
    "against_policy": "references",
    "against_torch": "torch_reference",
    "with_policy": "references",
    "load_torch_state_dict": "torch_weights",
    "to_torch_state_dict": "torch_weights",
    "build_torch_mirror": "torch_mirrors",
    "compare_curves": "curves",
    "compare_training": "curves",
}
_SUBMODULES = {
    "numpy_ref",
    "tolerance",
    "report",
    "tree",
    "layer_recording",
    "layer_report",
    "layerwise",
    "gradients",
    "reference_report",
    "references",
    "numpy_forward",
    "torch_weights",
    "torch_mirrors",
    "torch_layerwise",
    "torch_reference",
    "curves",
    "command",
}

__all__ = [
    "CompareReport",
    "LayerTolerance",
    "ShapeMismatchError",
    "Tolerance",
    "TreeReport",
    "TreeStructureError",
    "against_layout",
    "against_numpy",
    "against_policy",
    "against_torch",
    "assert_close",
    "assert_trees_close",
    "build_torch_mirror",
    "compare",
    "compare_curves",
    "compare_gradients",
    "compare_layerwise",
    "compare_training",
    "compare_trees",
    "default_tolerance",
    "load_torch_state_dict",
    "numpy_ref",
    "scaled",
    "to_torch_state_dict",
    "with_policy",
]


def __getattr__(name: str):
    if name in _EXPORTS:
        module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
        return getattr(module, name)
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
