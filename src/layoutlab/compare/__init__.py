"""Numerics comparison: dtype-aware tolerances, array and pytree reports, float64 references.

Names are imported lazily so that ``import layoutlab.compare`` stays light; the float64 NumPy
reference ops live in ``layoutlab.compare.numpy_ref``.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Tolerance": "tolerance",
    "default_tolerance": "tolerance",
    "resolve_tolerance": "tolerance",
    "scaled": "tolerance",
    "CompareReport": "report",
    "ShapeMismatchError": "report",
    "compare": "report",
    "assert_close": "report",
    "TreeReport": "tree",
    "TreeStructureError": "tree",
    "compare_trees": "tree",
    "assert_trees_close": "tree",
    "LayerOutput": "layer_recording",
    "LayerRow": "layer_report",
    "LayerTolerance": "layer_report",
    "LayerwiseReport": "layer_report",
    "compare_gradients": "gradient_comparison",
    "compare_layerwise": "layerwise",
    "highest_precision": "layer_recording",
    "layer_outputs": "layer_recording",
    "record_layers": "layer_recording",
    "ReferenceReport": "reference_report",
    "against_layout": "references",
    "against_numpy": "references",
    "against_policy": "references",
    "against_torch": "torch_reference",
    "default_layer_tolerance": "references",
    "with_policy": "references",
    "StateDictKeyError": "torch_weights",
    "StateDictShapeError": "torch_weights",
    "load_torch_state_dict": "torch_weights",
    "to_torch_state_dict": "torch_weights",
    "torch_keys": "torch_weights",
    "build_torch_mirror": "torch_mirrors",
    "CurveReport": "curves",
    "RunConfig": "curves",
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

__all__ = sorted([*_EXPORTS, "numpy_ref"])


def __getattr__(name: str):
    if name in _EXPORTS:
        module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
        return getattr(module, name)
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
