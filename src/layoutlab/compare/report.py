"""Compare two arrays and report how far apart they are, not just whether they are.

Closeness rule, evaluated in float64: an element mismatches when
``|actual - expected| > atol + rtol * |expected|`` (the ``torch.testing.assert_close`` rule).

Non-finite values:

- NaN must sit at the same positions on both sides. With ``equal_nan=True`` (the default) a NaN
  in both arrays at the same index counts as equal; a NaN on one side only is a mismatch.
- ``+inf``/``-inf`` match only the same infinity at the same index.
- Error statistics (max abs/rel/ULP error, cosine similarity) cover the elements that are finite
  on both sides; non-finite mismatches are counted in ``mismatches`` and
  ``nonfinite_mismatches``.

JSON: ``to_dict()`` is JSON-safe. Non-finite floats become the strings ``"inf"``, ``"-inf"``
and ``"nan"`` (strict JSON has no such numbers), indices become lists and missing values
``null``. ``CompareReport.from_dict`` undoes this.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import ml_dtypes
import numpy as np

from layoutlab.compare.tolerance import (
    EXACT,
    is_float_dtype,
    least_precise_float,
    resolve_tolerance,
)

__all__ = ["CompareReport", "ShapeMismatchError", "compare", "assert_close"]

Index = tuple[int, ...]


class ShapeMismatchError(ValueError):
    """The two arrays compared have different shapes."""


@dataclasses.dataclass(frozen=True)
class CompareReport:
    """How ``actual`` differs from ``expected``; ``passed`` when no element mismatches."""

    name: str
    shape: Index
    actual_dtype: str
    expected_dtype: str
    rtol: float
    atol: float
    tolerance_source: str  # "default" (from the dtypes) or "given"
    equal_nan: bool
    size: int
    mismatches: int
    mismatch_percent: float
    first_mismatch_index: Index | None
    max_abs_error: float
    max_abs_index: Index | None
    max_abs_actual: float | None  # the two values at max_abs_index
    max_abs_expected: float | None
    max_rel_error: float  # inf when expected is 0 and actual is not
    max_rel_index: Index | None
    ulp_dtype: str | None  # the less precise float dtype; None for integer comparisons
    max_ulp_error: float | None
    cosine_similarity: float | None  # None when no element is finite on both sides
    nan_actual: int
    nan_expected: int
    inf_actual: int
    inf_expected: int
    nonfinite_mismatches: int
    passed: bool

    def __str__(self) -> str:
        return format_report(self)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _to_json_value(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompareReport:
        kwargs = {}
        for f in dataclasses.fields(cls):
            value = data[f.name]
            if f.name in _INDEX_FIELDS and value is not None:
                value = tuple(int(i) for i in value)
            elif isinstance(value, str) and f.name in _FLOAT_FIELDS:
                value = float(value)
            kwargs[f.name] = value
        return cls(**kwargs)


_INDEX_FIELDS = {"shape", "first_mismatch_index", "max_abs_index", "max_rel_index"}
_FLOAT_FIELDS = {
    "rtol",
    "atol",
    "mismatch_percent",
    "max_abs_error",
    "max_abs_actual",
    "max_abs_expected",
    "max_rel_error",
    "max_ulp_error",
    "cosine_similarity",
}


def _to_json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "inf", "-inf", "nan"
    if isinstance(value, tuple):
        return list(value)
    return value


def _as_array(x: Any, which: str) -> np.ndarray:
    arr = np.asarray(x)
    if not (is_float_dtype(arr.dtype) or np.issubdtype(arr.dtype, np.integer)):
        if not np.issubdtype(arr.dtype, np.bool_):
            raise ValueError(
                f"{which} has dtype {arr.dtype}; compare supports float, integer and bool arrays "
                "(compare complex arrays through their real and imaginary parts)."
            )
    return arr


def _check_shapes(a: np.ndarray, e: np.ndarray, name: str) -> None:
    if a.shape == e.shape:
        return
    where = f"{name}: " if name else ""
    hint = ""
    if sorted(a.shape) == sorted(e.shape):
        hint = (
            " The shapes are permutations of each other; if one side is in the other layout, "
            "convert it first with layoutlab.to_layout."
        )
    raise ShapeMismatchError(
        f"{where}shape mismatch: actual has shape {a.shape}, expected has shape {e.shape}.{hint}"
    )


def _index(flat: int, shape: Index) -> Index:
    return tuple(int(i) for i in np.unravel_index(flat, shape))


def _ulp(expected: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Spacing of ``dtype`` just above ``|expected|`` rounded to ``dtype``, in float64."""
    info = ml_dtypes.finfo(dtype)
    mag = np.abs(expected.astype(dtype).astype(np.float64))
    mag = np.where(np.isfinite(mag), mag, float(info.max))  # overflowed when rounded
    _, exponent = np.frexp(mag)  # mag = m * 2**exponent with m in [0.5, 1)
    ulp = np.ldexp(1.0, exponent - 1 - int(info.nmant))
    return np.where(mag < float(info.smallest_normal), float(info.smallest_subnormal), ulp)


def _cosine(a: np.ndarray, e: np.ndarray) -> float | None:
    if a.size == 0:
        return None
    sa, se = float(np.max(np.abs(a))), float(np.max(np.abs(e)))
    if sa == 0.0 and se == 0.0:
        return 1.0  # both all-zero: identical
    if sa == 0.0 or se == 0.0:
        return 0.0  # one all-zero: no direction in common
    a, e = a / sa, e / se  # rescale so the dot product cannot overflow
    cos = float(np.dot(a, e) / (np.linalg.norm(a) * np.linalg.norm(e)))
    return min(1.0, max(-1.0, cos))


def _argmax(values: np.ndarray, shape: Index) -> tuple[float, Index | None]:
    if values.size == 0:
        return 0.0, None
    flat = int(np.argmax(values))
    top = float(values.flat[flat])
    return top, (_index(flat, shape) if top > 0 else None)


def compare(
    actual: Any,
    expected: Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    name: str = "",
    equal_nan: bool = True,
) -> CompareReport:
    """Compare ``actual`` with ``expected`` (numpy or jax arrays of the same shape).

    ``rtol``/``atol`` default to the looser of the two dtypes' defaults (see
    ``default_tolerance``); give both or neither. Integers and bools compare exactly by default.
    """
    a_raw, e_raw = _as_array(actual, "actual"), _as_array(expected, "expected")
    _check_shapes(a_raw, e_raw, name)
    tol = resolve_tolerance(rtol, atol, (a_raw.dtype, e_raw.dtype))
    shape = a_raw.shape
    a, e = a_raw.astype(np.float64), e_raw.astype(np.float64)
    with np.errstate(all="ignore"):
        nan_a, nan_e = np.isnan(a), np.isnan(e)
        inf_a, inf_e = np.isinf(a), np.isinf(e)
        finite = ~(nan_a | nan_e | inf_a | inf_e)
        abs_err = np.where(finite, np.abs(a - e), 0.0)
        abs_e = np.abs(e)
        floats = is_float_dtype(a_raw.dtype) or is_float_dtype(e_raw.dtype)
        if not floats and tol == EXACT:
            # Exact integer comparison: float64 cannot hold every int64.
            bad = np.asarray(a_raw != e_raw)
        else:
            bad = finite & (abs_err > tol.atol + tol.rtol * abs_e)
        same_nonfinite = (inf_a & inf_e & (a == e)) | ((nan_a & nan_e) if equal_nan else False)
        nonfinite_bad = ~finite & ~same_nonfinite
        mismatch = bad | nonfinite_bad

        rel_err = np.where(abs_e > 0, abs_err / np.where(abs_e > 0, abs_e, 1.0), 0.0)
        rel_err = np.where((abs_e == 0) & (abs_err > 0), np.inf, rel_err)
        ulp_dtype = least_precise_float(a_raw.dtype, e_raw.dtype)
        ulp_err = abs_err / _ulp(e, ulp_dtype) if ulp_dtype is not None else None

    max_abs, abs_idx = _argmax(abs_err, shape)
    max_rel, rel_idx = _argmax(rel_err, shape)
    n_bad = int(np.count_nonzero(mismatch))
    first_bad = _index(int(np.flatnonzero(mismatch)[0]), shape) if n_bad else None
    size = int(a.size)
    return CompareReport(
        name=name,
        shape=tuple(int(s) for s in shape),
        actual_dtype=str(a_raw.dtype),
        expected_dtype=str(e_raw.dtype),
        rtol=float(tol.rtol),
        atol=float(tol.atol),
        tolerance_source="default" if rtol is None else "given",
        equal_nan=bool(equal_nan),
        size=size,
        mismatches=n_bad,
        mismatch_percent=100.0 * n_bad / size if size else 0.0,
        first_mismatch_index=first_bad,
        max_abs_error=max_abs,
        max_abs_index=abs_idx,
        max_abs_actual=float(a[abs_idx]) if abs_idx is not None else None,
        max_abs_expected=float(e[abs_idx]) if abs_idx is not None else None,
        max_rel_error=max_rel,
        max_rel_index=rel_idx,
        ulp_dtype=str(ulp_dtype) if ulp_dtype is not None else None,
        max_ulp_error=None if ulp_err is None else (float(ulp_err.max()) if size else 0.0),
        cosine_similarity=_cosine(a[finite], e[finite]),
        nan_actual=int(nan_a.sum()),
        nan_expected=int(nan_e.sum()),
        inf_actual=int(inf_a.sum()),
        inf_expected=int(inf_e.sum()),
        nonfinite_mismatches=int(np.count_nonzero(nonfinite_bad)),
        passed=n_bad == 0,
    )


def assert_close(
    actual: Any,
    expected: Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    msg: str = "",
    name: str = "",
    equal_nan: bool = True,
) -> CompareReport:
    """``compare`` and raise ``AssertionError`` with the readable report if anything mismatches;
    return the report otherwise."""
    report = compare(actual, expected, rtol=rtol, atol=atol, name=name, equal_nan=equal_nan)
    if not report.passed:
        raise AssertionError(f"{msg}\n{report}" if msg else str(report))
    return report


def fmt_float(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.6g}"


def fmt_index(idx: Index | None) -> str:
    return "-" if idx is None else str(tuple(idx))


def format_report(r: CompareReport) -> str:
    title = f"compare {r.name!r}" if r.name else "compare"
    if r.passed:
        verdict = f"PASSED ({r.size} elements within tolerance)"
    else:
        verdict = f"FAILED ({r.mismatches} of {r.size} elements outside tolerance)"
    worst = ""
    if r.max_abs_index is not None:
        worst = (
            f" at {fmt_index(r.max_abs_index)}: actual {fmt_float(r.max_abs_actual)}, "
            f"expected {fmt_float(r.max_abs_expected)}"
        )
    rel_at = f" at {fmt_index(r.max_rel_index)}" if r.max_rel_index is not None else ""
    ulp = "-" if r.max_ulp_error is None else f"{fmt_float(r.max_ulp_error)} ({r.ulp_dtype})"
    first = f", first at {fmt_index(r.first_mismatch_index)}" if r.mismatches else ""
    rows = [
        ("shape", str(tuple(r.shape))),
        ("dtypes", f"actual {r.actual_dtype} | expected {r.expected_dtype}"),
        ("tolerance", f"rtol {r.rtol:g}, atol {r.atol:g} ({r.tolerance_source})"),
        ("max abs error", fmt_float(r.max_abs_error) + worst),
        ("max rel error", fmt_float(r.max_rel_error) + rel_at),
        ("max ULP error", ulp),
        ("cosine similarity", fmt_float(r.cosine_similarity)),
        ("mismatches", f"{r.mismatches} / {r.size} ({r.mismatch_percent:.4g}%){first}"),
        ("NaN actual/expected", f"{r.nan_actual} / {r.nan_expected}"),
        ("inf actual/expected", f"{r.inf_actual} / {r.inf_expected}"),
    ]
    if r.nonfinite_mismatches:
        rows.append(("non-finite mismatches", str(r.nonfinite_mismatches)))
    width = max(len(k) for k, _ in rows)
    lines = [f"{title}: {verdict}"] + [f"  {k.ljust(width)}  {v}" for k, v in rows]
    return "\n".join(lines)
