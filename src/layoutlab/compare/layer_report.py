"""Per-layer tolerances and the per-layer report: one row per layer (or per parameter's
gradient) in execution order, naming the first layer out of tolerance."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from layoutlab.compare.layer_recording import LayerOutput
from layoutlab.compare.report import CompareReport, compare, fmt_float
from layoutlab.layout import Layout, to_layout

__all__ = [
    "LayerTolerance",
    "LayerRow",
    "LayerwiseReport",
    "ZERO_FLOOR",
    "format_table",
    "format_layerwise",
    "to_reference_layout",
    "compare_records",
]

# --------------------------------------------------------------------------- tolerance


class LayerTolerance(NamedTuple):
    """Per-layer closeness rule ``|a - e| <= atol_eff + rtol * |e|``.

    With ``relative_to_max`` the absolute part scales with the layer: ``atol_eff = atol *
    max|expected|``, a normwise (infinity-norm) bound. Rounding error in an output element is
    proportional to the size of the values summed into it, not to the element itself, so the
    near-zero outputs of a layer (cancellation) carry absolute errors of the layer's scale.
    A layer whose reference is (near) zero throughout, such as the gradient of a BatchNorm
    bias that a following train-mode BatchNorm cancels exactly, is rounding noise of
    ordinary-sized terms: its scale is at least ``ZERO_FLOOR`` times the median layer's.
    """

    rtol: float
    atol: float
    relative_to_max: bool = False

    def effective(self, expected: np.ndarray, floor: float = 0.0) -> tuple[float, float]:
        """``(rtol, atol_eff)`` for one layer; ``floor`` is the least scale to assume."""
        if not self.relative_to_max:
            return float(self.rtol), float(self.atol)
        return float(self.rtol), float(self.atol) * max(_max_abs(expected), floor, 1e-30)

    def describe(self) -> str:
        atol = f"{self.atol:g} x max|expected|" if self.relative_to_max else f"{self.atol:g}"
        return f"rtol {self.rtol:g}, atol {atol}"


ZERO_FLOOR = 0.1


def _max_abs(x: np.ndarray) -> float:
    x = np.abs(np.asarray(x, np.float64))
    finite = x[np.isfinite(x)]
    return float(finite.max()) if finite.size else 0.0


def _rms(x: np.ndarray) -> float:
    x = np.asarray(x, np.float64)
    finite = x[np.isfinite(x)]
    return float(np.sqrt(np.mean(np.square(finite)))) if finite.size else 0.0


def _rel_l2(actual: np.ndarray, expected: np.ndarray) -> float:
    a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    ok = np.isfinite(a) & np.isfinite(e)
    if not ok.all():
        return math.inf
    denom = float(np.linalg.norm(e))
    diff = float(np.linalg.norm(a - e))
    if denom == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / denom


# --------------------------------------------------------------------------- reports


@dataclasses.dataclass(frozen=True)
class LayerRow:
    """One layer (or one parameter's gradient): where it is, what it is, how far off."""

    index: int
    path: str
    op: str
    report: CompareReport
    rel_l2: float  # ||actual - expected|| / ||expected||
    rms_expected: float
    # Gradient rows only: the ReLU/max-pool decision flips that reach this row (``flips: 3
    # at layer1.1.relu``) and the comparison rerun with those decisions pinned to the
    # reference's; such a row is judged on the pinned rerun.
    flips: str = ""
    pinned: CompareReport | None = None

    @property
    def passed(self) -> bool:
        return (self.pinned if self.pinned is not None else self.report).passed

    @property
    def explained_by_flips(self) -> bool:
        """Out of tolerance as run, within it on the reference's decisions."""
        return self.pinned is not None and self.pinned.passed and not self.report.passed

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.report.shape)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "path": self.path,
            "op": self.op,
            "shape": list(self.shape),
            "rel_l2": _json_float(self.rel_l2),
            "rms_expected": _json_float(self.rms_expected),
            "passed": self.passed,
            "report": self.report.to_dict(),
            "flips": self.flips,
            "pinned": self.pinned.to_dict() if self.pinned is not None else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LayerRow:
        return cls(
            index=int(data["index"]),
            path=data["path"],
            op=data["op"],
            report=CompareReport.from_dict(data["report"]),
            rel_l2=float(data["rel_l2"]),
            rms_expected=float(data["rms_expected"]),
            flips=data.get("flips", ""),
            pinned=CompareReport.from_dict(data["pinned"]) if data.get("pinned") else None,
        )


def _json_float(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


@dataclasses.dataclass(frozen=True)
class LayerwiseReport:
    """Per-layer comparison in execution order; ``first_failure`` is the first layer out of
    tolerance, which is where a divergence starts."""

    kind: str  # "activations" or "gradients"
    reference: str
    candidate: str
    tolerance: str
    rows: tuple[LayerRow, ...]
    settings: dict = dataclasses.field(default_factory=dict)
    unmatched_reference: tuple[str, ...] = ()
    unmatched_candidate: tuple[str, ...] = ()
    # Gradient reports: ``(site, kind, count)`` of every ReLU/ReLU6/max-pool site where the
    # candidate decided differently from the reference, in execution order; ``None`` when
    # decisions were not compared.
    decision_flips: tuple[tuple[str, str, int], ...] | None = None

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    @property
    def failures(self) -> tuple[LayerRow, ...]:
        return tuple(r for r in self.rows if not r.passed)

    @property
    def first_failure(self) -> LayerRow | None:
        return next((r for r in self.rows if not r.passed), None)

    def __getitem__(self, path: str) -> LayerRow:
        for r in self.rows:
            if r.path == path:
                return r
        raise KeyError(f"No layer {path!r}; layers are: {[r.path for r in self.rows]}")

    def depth_profile(self) -> list[dict[str, Any]]:
        """Error against depth (execution index): how error accumulates through the net."""
        return [
            {
                "depth": r.index,
                "path": r.path,
                "op": r.op,
                "rel_l2": r.rel_l2,
                "max_abs_error": r.report.max_abs_error,
                "max_abs_over_rms": r.report.max_abs_error / r.rms_expected
                if r.rms_expected > 0
                else math.inf,
            }
            for r in self.rows
        ]

    def __str__(self) -> str:
        return format_layerwise(self)

    def to_dict(self) -> dict[str, Any]:
        first = self.first_failure
        return {
            "kind": self.kind,
            "reference": self.reference,
            "candidate": self.candidate,
            "tolerance": self.tolerance,
            "settings": _jsonable(self.settings),
            "passed": self.passed,
            "num_rows": len(self.rows),
            "num_failed": len(self.failures),
            "first_failure": first.path if first is not None else None,
            "unmatched_reference": list(self.unmatched_reference),
            "unmatched_candidate": list(self.unmatched_candidate),
            "decision_flips": [list(f) for f in self.decision_flips]
            if self.decision_flips is not None
            else None,
            "rows": [r.to_dict() for r in self.rows],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LayerwiseReport:
        return cls(
            kind=data["kind"],
            reference=data["reference"],
            candidate=data["candidate"],
            tolerance=data["tolerance"],
            rows=tuple(LayerRow.from_dict(r) for r in data["rows"]),
            settings=dict(data.get("settings", {})),
            unmatched_reference=tuple(data.get("unmatched_reference", ())),
            unmatched_candidate=tuple(data.get("unmatched_candidate", ())),
            decision_flips=tuple(tuple(f) for f in data["decision_flips"])
            if data.get("decision_flips") is not None
            else None,
        )


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float):
        return _json_float(value)
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    return str(value)


_COLUMNS = ("#", "layer", "op", "shape", "max abs", "max rel", "rel L2", "cosine", "status")


def _status(r: LayerRow) -> str:
    if not r.flips:
        return "ok" if r.passed else f"FAIL ({r.report.mismatches})"
    if r.passed:
        return r.flips
    return f"FAIL ({r.pinned.mismatches} with decisions pinned; {r.flips})"


def _row_cells(r: LayerRow) -> tuple[str, ...]:
    status = _status(r)
    return (
        str(r.index),
        r.path,
        r.op,
        "x".join(str(s) for s in r.shape) or "()",
        fmt_float(r.report.max_abs_error),
        fmt_float(r.report.max_rel_error),
        fmt_float(r.rel_l2),
        fmt_float(r.report.cosine_similarity),
        status,
    )


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned text table with a rule under the header."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def format_layerwise(report: LayerwiseReport) -> str:
    what = "layer outputs" if report.kind == "activations" else "parameter gradients"
    verdict = (
        f"PASSED ({len(report.rows)} {what} within tolerance)"
        if report.passed
        else f"FAILED ({len(report.failures)} of {len(report.rows)} {what} out of tolerance)"
    )
    lines = [
        f"layerwise {report.kind}: {report.candidate} vs reference {report.reference}: {verdict}",
        f"  tolerance: {report.tolerance}",
    ]
    for key, value in report.settings.items():
        lines.append(f"  {key}: {value}")
    if report.decision_flips is not None:
        flips = report.decision_flips
        lines.append(
            "  ReLU/max-pool decisions differing from the reference: "
            + (", ".join(f"{n} at {site} ({kind})" for site, kind, n in flips) or "none")
        )
    lines += format_table(_COLUMNS, [_row_cells(r) for r in report.rows])
    for side, paths in (
        ("reference", report.unmatched_reference),
        ("candidate", report.unmatched_candidate),
    ):
        if paths:
            more = f", ... ({len(paths) - 8} more)" if len(paths) > 8 else ""
            lines.append(f"not compared, only in the {side}: {', '.join(paths[:8])}{more}")
    first = report.first_failure
    if first is not None:
        lines += [
            "",
            f"First divergence: #{first.index} {first.path} ({first.op})",
            str(first.report),
        ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- comparing


def to_reference_layout(value: np.ndarray, src: Layout | None, dst: Layout | None) -> np.ndarray:
    if src is None or dst is None or src == dst or value.ndim != src.rank:
        return value
    return np.asarray(to_layout(value, src, dst))


def compare_records(
    reference: Sequence[LayerOutput],
    candidate: Sequence[LayerOutput],
    tolerance: LayerTolerance,
    *,
    reference_layout: Layout | None = None,
    candidate_layout: Layout | None = None,
    kind: str = "activations",
    reference_name: str = "reference",
    candidate_name: str = "candidate",
    settings: dict | None = None,
) -> LayerwiseReport:
    """Compare two recordings path by path, in the reference's order. Activations of the
    rank of ``candidate_layout`` are moved to ``reference_layout`` first."""
    cand = {r.path: r for r in candidate}
    ref_paths = {r.path for r in reference}
    scales = [_max_abs(np.asarray(r.value)) for r in reference if r.path in cand]
    floor = ZERO_FLOOR * float(np.median(scales)) if scales else 0.0
    rows = []
    for r in reference:
        c = cand.get(r.path)
        if c is None:
            continue
        actual = to_reference_layout(np.asarray(c.value), candidate_layout, reference_layout)
        expected = np.asarray(r.value)
        if (
            actual.shape != expected.shape
            and np.squeeze(actual).shape == np.squeeze(expected).shape
        ):
            # e.g. torch's AdaptiveAvgPool2d((1, 1)) gives (N, C, 1, 1) where ours gives (N, C)
            actual = actual.reshape(expected.shape)
        rtol, atol = tolerance.effective(expected, floor)
        report = compare(actual, expected, rtol=rtol, atol=atol, name=r.path)
        rows.append(
            LayerRow(len(rows), r.path, c.op, report, _rel_l2(actual, expected), _rms(expected))
        )
    return LayerwiseReport(
        kind=kind,
        reference=reference_name,
        candidate=candidate_name,
        tolerance=tolerance.describe(),
        rows=tuple(rows),
        settings=dict(settings or {}),
        unmatched_reference=tuple(r.path for r in reference if r.path not in cand),
        unmatched_candidate=tuple(c.path for c in candidate if c.path not in ref_paths),
    )
