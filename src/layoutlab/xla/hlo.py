"""HLO reports: op counts, fusions, data movement (transposes, copies, converts), convs, dots.

``hlo_report(text)`` reads optimized HLO (``compiled.as_text()``) or pre-optimization HLO
(``lowered.as_text(dialect="hlo")``) and lists what a layout or precision choice costs:

- every ``transpose``, ``copy`` and ``convert``, at top level or inside a fusion computation
  (``nested=True``, ``fusion`` names the fusion instruction that runs it). ``bytes_moved`` is
  bytes read plus bytes written (operand bytes + result bytes) as if the op ran on its own;
  inside a fusion XLA may never materialize one side, so read it as an upper bound.
  ``permutes_memory`` says whether the element order in memory changes: XLA often writes a
  transpose as a layout-only ``transpose`` (a bitcast) followed by a layout-changing ``copy``,
  and only the copy moves data.
- every convolution (``convolution`` ops and custom-calls whose target names a conv, such as
  ``__cudnn$convForward``) with its ``dim_labels`` decoded into a *logical* order (the axes as
  the op sees them, e.g. ``NCHW``/``OIHW``) and a *physical* order (the same axes from slowest
  to fastest in memory, read from the ``{minor_to_major}`` layouts, e.g. ``NHWC``/``HWIO``).
- every ``dot`` (and cuBLAS gemm custom-calls) with its shapes.
- the convs that run as oneDNN calls (the ``onednn`` conv algorithm's custom-calls, targets
  ``layoutlab_onednn_*``), counted by kind beside XLA's convs (``onednn_convs``); they are not
  among ``convolutions``, whose layouts XLA chooses.

The records are in ``hlo_ops``, the reading of instructions into them in ``hlo_extract``,
the text parser in ``hlo_parse``.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping

from layoutlab.xla.hlo_extract import (
    ONEDNN_CONV_KINDS,
    classify_computations,
    fusion_kind,
    onednn_kind,
    op_records,
)
from layoutlab.xla.hlo_ops import ConvOp, CustomCallOp, DataMoveOp, DotOp, dtype_trio, layout_trio
from layoutlab.xla.hlo_parse import HloModule, parse_hlo

__all__ = [
    "HloReport",
    "compare_table",
    "conv_table",
    "diff",
    "hlo_report",
    "onednn_line",
]


# ---------------------------------------------------------------- report


def _sum(values) -> int:
    return sum(v for v in values if v is not None)


@dataclasses.dataclass
class HloReport:
    """What one HLO module does; totals are properties, ``to_dict()`` is JSON-ready.

    ``op_counts`` counts opcodes in the entry computation and control-flow bodies;
    ``fused_op_counts`` counts opcodes inside fusion computations; scalar ``to_apply``
    lambdas (reduction bodies) are in neither.
    """

    module: str | None
    op_counts: dict[str, int]
    fused_op_counts: dict[str, int]
    fusion_kinds: dict[str, int]
    transposes: list[DataMoveOp]
    copies: list[DataMoveOp]
    converts: list[DataMoveOp]
    convolutions: list[ConvOp]
    dots: list[DotOp]
    custom_calls: list[CustomCallOp]
    computation_kinds: dict[str, str]

    @property
    def num_fusions(self) -> int:
        return sum(self.fusion_kinds.values())

    @property
    def top_level_transposes(self) -> list[DataMoveOp]:
        return [t for t in self.transposes if not t.nested]

    @property
    def nested_transposes(self) -> list[DataMoveOp]:
        return [t for t in self.transposes if t.nested]

    @property
    def memory_permutations(self) -> list[DataMoveOp]:
        """Transposes and copies that reorder memory, however XLA spelled them."""
        return [op for op in self.transposes + self.copies if op.permutes_memory]

    @property
    def conversions(self) -> dict[str, int]:
        return dict(collections.Counter(c.conversion for c in self.converts if c.conversion))

    def totals(self) -> dict[str, int]:
        return {
            "instructions": sum(self.op_counts.values()),
            "fused_instructions": sum(self.fused_op_counts.values()),
            "fusions": self.num_fusions,
            "transposes": len(self.transposes),
            "transposes_top_level": len(self.top_level_transposes),
            "transposes_nested": len(self.nested_transposes),
            "transpose_bytes": _sum(t.bytes_moved for t in self.transposes),
            "copies": len(self.copies),
            "copy_bytes": _sum(c.bytes_moved for c in self.copies),
            "memory_permutations": len(self.memory_permutations),
            "memory_permutation_bytes": _sum(p.bytes_moved for p in self.memory_permutations),
            "converts": len(self.converts),
            "convert_bytes": _sum(c.bytes_moved for c in self.converts),
            "convolutions": len(self.convolutions),
            "onednn_convs": sum(self.onednn_convs().values()),
            "onednn_batch_norms": self.onednn_batch_norms(),
            "onednn_max_pools": self.onednn_max_pools(),
            "dots": len(self.dots),
            "custom_calls": len(self.custom_calls),
        }

    def onednn_convs(self) -> dict[str, int]:
        """How many convs run as oneDNN calls, by kind: ``{"forward": 20, "backward data":
        19, "backward weights": 20}`` (empty when none do)."""
        kinds = (onednn_kind(c.target) for c in self.custom_calls)
        return dict(collections.Counter(k for k in kinds if k in ONEDNN_CONV_KINDS))

    def onednn_batch_norms(self) -> int:
        """How many oneDNN batch-normalization calls (forward and backward) the program makes."""
        return self._onednn_calls("batch_norm")

    def onednn_max_pools(self) -> int:
        """How many oneDNN max-pooling calls (forward and backward) the program makes."""
        return self._onednn_calls("max_pool")

    def _onednn_calls(self, kind: str) -> int:
        kinds = (onednn_kind(c.target) for c in self.custom_calls)
        return sum(1 for k in kinds if k is not None and k.startswith(kind))

    def conv_layouts(self) -> dict[str, int]:
        """How many convs run in each physical layout, e.g. ``{"NHWC*HWIO->NHWC": 20}``."""
        return dict(
            collections.Counter(layout_trio(c.physical) or "unknown" for c in self.convolutions)
        )

    def operand_dtypes(self) -> dict[str, dict[str, int]]:
        """How many convolutions and dots run on each operand/result dtype combination,
        e.g. ``{"convolutions": {"f32*f32->f32": 20}, "dots": {"bf16*bf16->f32": 3}}``: on
        CPU a bf16 conv shows up as f32 (XLA converts its operands), a bf16 GEMM as bf16."""
        return {
            "convolutions": dict(collections.Counter(map(dtype_trio, self.convolutions))),
            "dots": dict(collections.Counter(map(dtype_trio, self.dots))),
        }

    def to_dict(self) -> dict:
        return {
            "module": self.module,
            "totals": self.totals(),
            "operand_dtypes": self.operand_dtypes(),
            "op_counts": dict(self.op_counts),
            "fused_op_counts": dict(self.fused_op_counts),
            "fusion_kinds": dict(self.fusion_kinds),
            "conversions": self.conversions,
            "conv_layouts": self.conv_layouts(),
            "onednn_convs": self.onednn_convs(),
            "transposes": [t.to_dict() for t in self.transposes],
            "copies": [c.to_dict() for c in self.copies],
            "converts": [c.to_dict() for c in self.converts],
            "convolutions": [c.to_dict() for c in self.convolutions],
            "dots": [d.to_dict() for d in self.dots],
            "custom_calls": [c.to_dict() for c in self.custom_calls],
            "computation_kinds": dict(self.computation_kinds),
        }

    def summary(self) -> str:
        t = self.totals()
        lines = [
            f"HLO module {self.module or '?'}: {t['instructions']} top-level instructions, "
            f"{t['fusions']} fusions {dict(self.fusion_kinds)}",
            f"  transposes: {t['transposes']} ({t['transposes_top_level']} top-level, "
            f"{t['transposes_nested']} in fusions), {t['transpose_bytes']} bytes moved",
            f"  copies: {t['copies']}, {t['copy_bytes']} bytes; memory permutations: "
            f"{t['memory_permutations']} ({t['memory_permutation_bytes']} bytes)",
            f"  converts: {t['converts']} {self.conversions}, {t['convert_bytes']} bytes",
            f"  convolutions: {t['convolutions']} {self.conv_layouts()}; "
            f"{onednn_line(self.onednn_convs())}; "
            f"oneDNN batch norms: {t['onednn_batch_norms']}; oneDNN max pools: "
            f"{t['onednn_max_pools']}; dots: {t['dots']}; "
            f"custom-calls: {t['custom_calls']}",
            f"  operand dtypes: {self.operand_dtypes()}",
        ]
        return "\n".join(lines)


def onednn_line(kinds: Mapping[str, int]) -> str:
    """``"oneDNN convs: 3 (forward 1, backward data 1, backward weights 1)"``."""
    parts = ", ".join(f"{k} {v}" for k, v in kinds.items())
    return f"oneDNN convs: {sum(kinds.values())}" + (f" ({parts})" if parts else "")


def hlo_report(text: str | HloModule) -> HloReport:
    """Parse HLO text (optimized or not) and collect the report."""
    module = text if isinstance(text, HloModule) else parse_hlo(text)
    kinds, fusion_of = classify_computations(module)
    op_counts: collections.Counter = collections.Counter()
    fused_counts: collections.Counter = collections.Counter()
    fusion_kinds: collections.Counter = collections.Counter()
    found: dict[str, list] = collections.defaultdict(list)
    for name, comp in module.computations.items():
        kind = kinds[name]
        if kind == "applied":
            continue
        fusion = fusion_of[name] if kind == "fusion" else None
        for ins in comp.instructions:
            (fused_counts if kind == "fusion" else op_counts)[ins.opcode] += 1
            if ins.opcode == "fusion":
                fusion_kinds[fusion_kind(ins)] += 1
            for key, record in op_records(ins, name, fusion):
                found[key].append(record)
    return HloReport(
        module=module.name,
        op_counts=dict(op_counts),
        fused_op_counts=dict(fused_counts),
        fusion_kinds=dict(fusion_kinds),
        transposes=found["transpose"],
        copies=found["copy"],
        converts=found["convert"],
        convolutions=found["conv"],
        dots=found["dot"],
        custom_calls=found["custom"],
        computation_kinds=kinds,
    )


# ---------------------------------------------------------------- comparisons


def diff(before: HloReport, after: HloReport) -> dict[str, tuple[int, int, int]]:
    """``{key: (before, after, after - before)}`` for totals and op counts that differ."""
    rows = {}
    b_tot, a_tot = before.totals(), after.totals()
    for key in b_tot:
        rows[key] = (b_tot[key], a_tot[key], a_tot[key] - b_tot[key])
    for label, b_counts, a_counts in (
        ("op", before.op_counts, after.op_counts),
        ("fused_op", before.fused_op_counts, after.fused_op_counts),
    ):
        for op in sorted(set(b_counts) | set(a_counts)):
            b, a = b_counts.get(op, 0), a_counts.get(op, 0)
            if a != b:
                rows[f"{label}:{op}"] = (b, a, a - b)
    return rows


def compare_table(reports: Mapping[str, HloReport], keys: list[str] | None = None) -> str:
    """Side-by-side totals of several reports, e.g. ``{"NHWC": r1, "NCHW": r2}``."""
    totals = {label: r.totals() for label, r in reports.items()}
    keys = (keys or list(next(iter(totals.values())))) if totals else []
    width = max(len(k) for k in keys) if keys else 0
    cols = [(label, max(len(label), 10), t) for label, t in totals.items()]
    lines = [" " * width + "  " + "  ".join(f"{label:>{w}}" for label, w, _ in cols)]
    for key in keys:
        cells = "  ".join(f"{t.get(key, 0):>{w}}" for _, w, t in cols)
        lines.append(f"{key:<{width}}  {cells}")
    return "\n".join(lines)


def conv_table(report: HloReport) -> str:
    """One line per convolution: name, logical and physical layouts, dtypes, shapes."""
    lines = []
    for c in report.convolutions:
        where = f" in {c.fusion}" if c.fusion else ""
        shapes = f"{c.lhs} * {c.rhs} -> {c.out}"
        lines.append(f"{c.name}{where}: {c.describe()}  {shapes}")
    return "\n".join(lines) if lines else "(no convolutions)"
