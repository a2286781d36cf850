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
}
_SUBMODULES = {"numpy_ref", "tolerance", "report", "tree"}

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
