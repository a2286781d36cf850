"""Compare two pytrees leaf by leaf (parameter dicts, lists, ``nnx.State``).

An ``nnx.State`` is compared through its pure-dict form (``State.to_pure_dict()``), so a State
and a pure dict of the same parameters compare leaf for leaf. PRNG key leaves compare through
their raw key data.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

import jax

from layoutlab.compare.report import (
    CompareReport,
    ShapeMismatchError,
    compare,
    fmt_float,
)

__all__ = ["TreeReport", "TreeStructureError", "compare_trees", "assert_trees_close"]


class TreeStructureError(ValueError):
    """The two pytrees compared have different structure."""


@dataclasses.dataclass(frozen=True)
class TreeReport:
    """One ``CompareReport`` per leaf, named by the leaf's key path."""

    leaves: tuple[CompareReport, ...]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.leaves)

    @property
    def failures(self) -> tuple[CompareReport, ...]:
        return tuple(r for r in self.leaves if not r.passed)

    @property
    def first_failure(self) -> CompareReport | None:
        failures = self.failures
        return failures[0] if failures else None

    def __getitem__(self, path: str) -> CompareReport:
        for r in self.leaves:
            if r.name == path:
                return r
        raise KeyError(f"No leaf {path!r}; leaves are: {[r.name for r in self.leaves]}")

    def __str__(self) -> str:
        return format_tree_report(self)

    def to_dict(self) -> dict[str, Any]:
        first = self.first_failure
        return {
            "passed": self.passed,
            "num_leaves": len(self.leaves),
            "num_failed": len(self.failures),
            "first_failure": first.name if first is not None else None,
            "leaves": [r.to_dict() for r in self.leaves],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TreeReport:
        return cls(tuple(CompareReport.from_dict(d) for d in data["leaves"]))


def _normalize(tree: Any) -> Any:
    if "flax" not in sys.modules:  # a tree holding an nnx.State means flax is loaded
        return tree
    from flax import nnx

    return nnx.to_pure_dict(tree) if isinstance(tree, nnx.State) else tree


def _leaf_array(leaf: Any) -> Any:
    dtype = getattr(leaf, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return jax.random.key_data(leaf)
    return leaf


def _structure_error(paths_a: list[str], paths_e: list[str], treedef_a, treedef_e) -> str:
    set_a, set_e = set(paths_a), set(paths_e)
    missing = [p for p in paths_e if p not in set_a]
    extra = [p for p in paths_a if p not in set_e]
    first = next(
        (i for i, (pa, pe) in enumerate(zip(paths_a, paths_e, strict=False)) if pa != pe),
        min(len(paths_a), len(paths_e)),
    )
    parts = ["The pytrees differ in structure."]
    if first < max(len(paths_a), len(paths_e)):
        pa = paths_a[first] if first < len(paths_a) else "<end>"
        pe = paths_e[first] if first < len(paths_e) else "<end>"
        parts.append(f"First difference at leaf #{first}: actual {pa}, expected {pe}.")
    if missing:
        parts.append(f"Missing in actual ({len(missing)}): {', '.join(missing[:10])}.")
    if extra:
        parts.append(f"Extra in actual ({len(extra)}): {', '.join(extra[:10])}.")
    if not missing and not extra and paths_a == paths_e:
        parts.append(
            f"Same leaf paths but different node types: actual {treedef_a}, expected {treedef_e}."
        )
    return " ".join(parts)


def compare_trees(
    actual: Any,
    expected: Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    equal_nan: bool = True,
) -> TreeReport:
    """Compare two pytrees of the same structure leaf by leaf; each leaf uses its own dtype
    default tolerance unless ``rtol`` and ``atol`` are given."""
    leaves_a, treedef_a = jax.tree_util.tree_flatten_with_path(_normalize(actual))
    leaves_e, treedef_e = jax.tree_util.tree_flatten_with_path(_normalize(expected))
    paths_a = [jax.tree_util.keystr(p) for p, _ in leaves_a]
    paths_e = [jax.tree_util.keystr(p) for p, _ in leaves_e]
    if paths_a != paths_e or treedef_a != treedef_e:
        raise TreeStructureError(_structure_error(paths_a, paths_e, treedef_a, treedef_e))
    reports = []
    for path, (_, a), (_, e) in zip(paths_a, leaves_a, leaves_e, strict=True):
        try:
            reports.append(
                compare(
                    _leaf_array(a),
                    _leaf_array(e),
                    rtol=rtol,
                    atol=atol,
                    name=path,
                    equal_nan=equal_nan,
                )
            )
        except ShapeMismatchError:
            raise
        except ValueError as err:
            raise ValueError(f"leaf {path}: {err}") from err
    return TreeReport(tuple(reports))


def assert_trees_close(
    actual: Any,
    expected: Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    msg: str = "",
    equal_nan: bool = True,
) -> TreeReport:
    """``compare_trees`` and raise ``AssertionError`` with the table and the first failing
    leaf's full report if any leaf mismatches; return the report otherwise."""
    report = compare_trees(actual, expected, rtol=rtol, atol=atol, equal_nan=equal_nan)
    if not report.passed:
        raise AssertionError(f"{msg}\n{report}" if msg else str(report))
    return report


_COLUMNS = ("leaf", "shape", "dtype (actual/expected)", "max abs", "max rel", "max ULP", "bad")


def _row(r: CompareReport) -> tuple[str, ...]:
    dtype = (
        r.actual_dtype
        if r.actual_dtype == r.expected_dtype
        else (f"{r.actual_dtype}/{r.expected_dtype}")
    )
    bad = "ok" if r.passed else f"{r.mismatches} FAIL"
    return (
        r.name,
        str(tuple(r.shape)),
        dtype,
        fmt_float(r.max_abs_error),
        fmt_float(r.max_rel_error),
        fmt_float(r.max_ulp_error),
        bad,
    )


def format_tree_report(report: TreeReport) -> str:
    rows = [_COLUMNS] + [_row(r) for r in report.leaves]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    n_failed = len(report.failures)
    if report.passed:
        head = f"compare_trees: PASSED ({len(report.leaves)} leaves)"
        return "\n".join([head, *lines])
    first = report.first_failure
    head = f"compare_trees: FAILED ({n_failed} of {len(report.leaves)} leaves)"
    tail = f"First failing leaf: {first.name}\n{first}"
    return "\n".join([head, *lines, "", tail])
