"""Dtype-aware default tolerances, in the spirit of ``torch.testing.assert_close``.

Two values ``a`` (actual) and ``e`` (expected) are close when ``|a - e| <= atol + rtol * |e|``.
The defaults depend on the dtypes compared; when two dtypes differ the looser of the two wins,
because the comparison can be no more precise than its least precise side.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np

__all__ = [
    "Tolerance",
    "EXACT",
    "default_tolerance",
    "resolve_tolerance",
    "scaled",
    "is_float_dtype",
    "least_precise_float",
]


class Tolerance(NamedTuple):
    """Relative and absolute tolerance of a closeness check."""

    rtol: float
    atol: float

    def scaled(self, factor: float) -> Tolerance:
        return scaled(self, factor)


EXACT = Tolerance(0.0, 0.0)

# torch.testing.assert_close's table; integers and bools compare exactly.
_TABLE: dict[np.dtype, Tolerance] = {
    np.dtype(np.float64): Tolerance(1e-7, 1e-7),
    np.dtype(np.float32): Tolerance(1.3e-6, 1e-5),
    np.dtype(ml_dtypes.bfloat16): Tolerance(1.6e-2, 1e-5),
    np.dtype(np.float16): Tolerance(1e-3, 1e-5),
}


def is_float_dtype(dtype: Any) -> bool:
    """True for numpy floats and the ml_dtypes floats (bfloat16, float8_*), which numpy
    itself does not classify as floating."""
    dtype = np.dtype(dtype)
    if np.issubdtype(dtype, np.floating):
        return True
    if dtype.kind != "V":  # ml_dtypes floats are "V"; numpy's finfo also accepts complex
        return False
    try:
        ml_dtypes.finfo(dtype)
    except (ValueError, TypeError):
        return False
    return True


def _is_exact_dtype(dtype: np.dtype) -> bool:
    if np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.bool_):
        return True
    try:
        ml_dtypes.iinfo(dtype)  # int4, uint4, ...
    except (ValueError, TypeError):
        return False
    return True


def _tolerance_of(dtype: Any) -> Tolerance:
    dtype = np.dtype(dtype)
    if dtype in _TABLE:
        return _TABLE[dtype]
    if is_float_dtype(dtype):
        # Floats outside the table (float8_*, ...): two machine epsilons relative, which is
        # about what the table gives bfloat16.
        eps = float(ml_dtypes.finfo(dtype).eps)
        return Tolerance(2.0 * eps, 1e-5)
    if _is_exact_dtype(dtype):
        return EXACT
    raise ValueError(
        f"No default tolerance for dtype {dtype}: compare floating, integer or bool arrays, "
        "or pass rtol and atol explicitly."
    )


def default_tolerance(*dtypes: Any) -> Tolerance:
    """The default tolerance for comparing arrays of ``dtypes``: the loosest of their entries.

    float64: rtol 1e-7, atol 1e-7; float32: rtol 1.3e-6, atol 1e-5; bfloat16: rtol 1.6e-2,
    atol 1e-5; float16: rtol 1e-3, atol 1e-5; other floats: rtol 2*eps, atol 1e-5;
    integers and bools: exact (0, 0).
    """
    if not dtypes:
        raise ValueError(
            "default_tolerance needs at least one dtype, e.g. default_tolerance(x.dtype)."
        )
    tols = [_tolerance_of(dt) for dt in dtypes]
    return Tolerance(max(t.rtol for t in tols), max(t.atol for t in tols))


def _check_value(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value}.")
    return value


def resolve_tolerance(
    rtol: float | None = None, atol: float | None = None, dtypes: tuple[Any, ...] = ()
) -> Tolerance:
    """``Tolerance(rtol, atol)`` when both are given, the dtypes' default when neither is."""
    if (rtol is None) != (atol is None):
        given = "rtol" if rtol is not None else "atol"
        raise ValueError(
            f"Only {given} was given: give both rtol and atol, or neither to use the dtype "
            "defaults."
        )
    if rtol is None:
        return default_tolerance(*dtypes)
    return Tolerance(_check_value("rtol", rtol), _check_value("atol", atol))


def scaled(tol: Tolerance, factor: float) -> Tolerance:
    """``tol`` with both rtol and atol multiplied by ``factor``.

    For mixed-precision results checked against a float64 reference: each rounding to a
    low-precision dtype adds up to half an ulp of relative error, so a result that passed
    through ``k`` bfloat16 roundings (or sums ``k`` rounded terms) can be ``k`` times off the
    single-rounding default. ``scaled(default_tolerance(jnp.bfloat16), k)`` states that budget
    explicitly instead of an unexplained magic number.
    """
    factor = float(factor)
    if not math.isfinite(factor) or factor <= 0:
        raise ValueError(f"scale factor must be a finite number > 0, got {factor}.")
    return Tolerance(tol.rtol * factor, tol.atol * factor)


def least_precise_float(*dtypes: Any) -> np.dtype | None:
    """The float dtype with the largest machine epsilon among ``dtypes``, or None if none is
    a float; the unit in which ULP errors are counted."""
    floats = [np.dtype(dt) for dt in dtypes if is_float_dtype(dt)]
    if not floats:
        return None
    return max(floats, key=lambda dt: float(ml_dtypes.finfo(dt).eps))
