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
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Mapping

from layoutlab.xla.hlo_parse import (
    ArrayShape,
    HloModule,
    Instruction,
    first_array,
    parse_hlo,
    shape_bytes,
)

__all__ = [
    "ConvOp",
    "CustomCallOp",
    "DataMoveOp",
    "DotOp",
    "HloReport",
    "Window",
    "compare_table",
    "conv_table",
    "decode_dim_labels",
    "diff",
    "hlo_report",
    "physical_order",
]

_SPATIAL_LETTERS = {1: "W", 2: "HW", 3: "DHW"}
_ACTIVATION_LETTERS = {"b": "N", "f": "C"}
_KERNEL_LETTERS = {"o": "O", "i": "I"}
_CALL_ATTRS = (
    "calls",
    "to_apply",
    "body",
    "condition",
    "true_computation",
    "false_computation",
    "branch_computations",
    "called_computations",
)
_NAME_RE = re.compile(r"%?([A-Za-z_][\w.\-]*)")


# ---------------------------------------------------------------- layouts


def _label_string(labels: str, letters: Mapping[str, str], spatial: str) -> str:
    out = []
    for c in labels:
        if c.isdigit():
            out.append(spatial[int(c)] if int(c) < len(spatial) else c)
        else:
            out.append(letters.get(c, c))
    return "".join(out)


def decode_dim_labels(dim_labels: str) -> dict[str, str]:
    """``"bf01_oi01->bf01"`` -> ``{"input": "NCHW", "kernel": "OIHW", "output": "NCHW"}``.

    Letters follow the array's dims in order: ``N`` batch, ``C`` features, ``O``/``I`` kernel
    output/input features, spatial dims ``W`` (1D), ``HW`` (2D) or ``DHW`` (3D).
    """
    m = re.fullmatch(r"\s*(\w+)_(\w+)->(\w+)\s*", dim_labels)
    if not m:
        raise ValueError(f"cannot read dim_labels {dim_labels!r}; expected e.g. 'b01f_01io->b01f'")
    lhs, rhs, out = m.groups()
    n_spatial = sum(c.isdigit() for c in lhs)
    spatial = _SPATIAL_LETTERS.get(n_spatial, "".join(str(i) for i in range(n_spatial)))
    return {
        "input": _label_string(lhs, _ACTIVATION_LETTERS, spatial),
        "kernel": _label_string(rhs, _KERNEL_LETTERS, spatial),
        "output": _label_string(out, _ACTIVATION_LETTERS, spatial),
    }


def physical_order(logical: str, shape: ArrayShape | None) -> str | None:
    """Reorder ``logical`` (one letter per dim) from slowest to fastest in memory."""
    if shape is None or len(logical) != len(shape.dims):
        return None
    return "".join(logical[d] for d in shape.major_to_minor)


# ---------------------------------------------------------------- op records


@dataclasses.dataclass(frozen=True)
class Window:
    size: tuple[int, ...]
    stride: tuple[int, ...]
    pad: tuple[tuple[int, int], ...]
    lhs_dilate: tuple[int, ...]
    rhs_dilate: tuple[int, ...]

    def to_dict(self) -> dict:
        items = vars(self).items()
        return {k: [list(p) if isinstance(p, tuple) else p for p in v] for k, v in items}


def parse_window(text: str | None) -> Window | None:
    """``"{size=3x3 stride=2x2 pad=1_1x1_1}"`` -> ``Window`` with defaults filled in."""
    if not text:
        return None
    fields = dict(tok.split("=", 1) for tok in text.strip("{} ").split() if "=" in tok)
    if "size" not in fields:
        return None
    size = tuple(int(x) for x in fields["size"].split("x"))
    n = len(size)

    def ints(key: str, default: int) -> tuple[int, ...]:
        return tuple(int(x) for x in fields[key].split("x")) if key in fields else (default,) * n

    pad = (
        tuple(tuple(int(v) for v in p.split("_")) for p in fields["pad"].split("x"))
        if "pad" in fields
        else ((0, 0),) * n
    )
    return Window(size, ints("stride", 1), pad, ints("lhs_dilate", 1), ints("rhs_dilate", 1))


def _shape_dict(shape) -> dict | list | None:
    if shape is None:
        return None
    if isinstance(shape, tuple):
        return [_shape_dict(s) for s in shape]
    return {
        "text": str(shape),
        "dtype": shape.dtype,
        "dims": list(shape.dims),
        "major_to_minor": list(shape.major_to_minor),
        "bytes": shape.nbytes,
    }


def _record_dict(record) -> dict:
    out = {}
    for f in dataclasses.fields(record):
        v = getattr(record, f.name)
        if isinstance(v, ArrayShape):
            v = _shape_dict(v)
        elif isinstance(v, Window):
            v = v.to_dict()
        elif isinstance(v, tuple):
            v = [_shape_dict(x) if isinstance(x, ArrayShape | tuple) else x for x in v]
        out[f.name] = v
    return out


@dataclasses.dataclass(frozen=True)
class DataMoveOp:
    """A transpose, copy or convert; ``bytes_moved = bytes_in + bytes_out``."""

    name: str
    opcode: str
    computation: str
    fusion: str | None  # the fusion instruction whose computation holds this op
    operand: ArrayShape | None
    result: ArrayShape | None
    bytes_in: int | None
    bytes_out: int | None
    permutes_memory: bool | None
    dimensions: tuple[int, ...] | None = None

    @property
    def nested(self) -> bool:
        return self.fusion is not None

    @property
    def bytes_moved(self) -> int | None:
        if self.bytes_in is None or self.bytes_out is None:
            return None
        return self.bytes_in + self.bytes_out

    @property
    def conversion(self) -> str | None:
        if self.operand is None or self.result is None:
            return None
        return f"{self.operand.dtype}->{self.result.dtype}"

    def to_dict(self) -> dict:
        d = _record_dict(self)
        d.update(nested=self.nested, bytes_moved=self.bytes_moved, conversion=self.conversion)
        return d


@dataclasses.dataclass(frozen=True)
class ConvOp:
    name: str
    opcode: str  # "convolution" or "custom-call"
    target: str | None  # custom_call_target, e.g. "__cudnn$convForward"
    computation: str
    fusion: str | None
    dim_labels: str | None
    lhs: ArrayShape | None
    rhs: ArrayShape | None
    out: ArrayShape | None
    feature_group_count: int
    batch_group_count: int
    window: Window | None
    logical: dict[str, str] | None  # {"input","kernel","output"} -> e.g. "NCHW"
    physical: dict[str, str | None] | None  # same keys, memory order e.g. "NHWC"

    @property
    def nested(self) -> bool:
        return self.fusion is not None

    def describe(self) -> str:
        """One line: ``NCHW*OIHW->NCHW (physical NHWC*HWIO->NHWC) f32*f32->f32``."""

        def trio(d):
            return f"{d['input']}*{d['kernel']}->{d['output']}" if d else "?"

        dtypes = "*".join(s.dtype if s else "?" for s in (self.lhs, self.rhs))
        return (
            f"{trio(self.logical)} (physical {trio(self.physical)}) "
            f"{dtypes}->{self.out.dtype if self.out else '?'}"
        )

    def to_dict(self) -> dict:
        d = _record_dict(self)
        d["nested"] = self.nested
        return d


@dataclasses.dataclass(frozen=True)
class DotOp:
    name: str
    opcode: str
    target: str | None
    computation: str
    fusion: str | None
    lhs: ArrayShape | None
    rhs: ArrayShape | None
    out: ArrayShape | None
    lhs_contracting_dims: tuple[int, ...]
    rhs_contracting_dims: tuple[int, ...]
    lhs_batch_dims: tuple[int, ...]
    rhs_batch_dims: tuple[int, ...]

    @property
    def nested(self) -> bool:
        return self.fusion is not None

    def to_dict(self) -> dict:
        d = _record_dict(self)
        d["nested"] = self.nested
        return d


@dataclasses.dataclass(frozen=True)
class CustomCallOp:
    name: str
    target: str
    computation: str
    fusion: str | None
    operands: tuple
    result: object

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "target": self.target,
            "computation": self.computation,
            "fusion": self.fusion,
            "operands": [_shape_dict(s) for s in self.operands],
            "result": _shape_dict(self.result),
        }


# ---------------------------------------------------------------- computation kinds


def _called(ins: Instruction) -> list[tuple[str, str]]:
    calls = []
    for attr in _CALL_ATTRS:
        if attr in ins.attrs:
            for name in _NAME_RE.findall(ins.attrs[attr]):
                calls.append((attr, name))
    return calls


def classify_computations(module: HloModule) -> tuple[dict[str, str], dict[str, str | None]]:
    """Kind of each computation and the fusion instruction that runs it.

    Kinds: ``entry``; ``fusion`` (body of a fusion, or anything called from one); ``applied``
    (``to_apply`` scalar lambdas of reduce/map/sort...); ``control`` (while/conditional/call
    bodies, and computations nothing calls).
    """
    kinds = {name: "entry" for name, c in module.computations.items() if c.is_entry}
    fusion_of: dict[str, str | None] = {name: None for name in kinds}
    queue = list(kinds)
    while queue:
        parent = queue.pop()
        comp = module.computations.get(parent)
        if comp is None:
            continue
        for ins in comp.instructions:
            for attr, child in _called(ins):
                if child in kinds or child not in module.computations:
                    continue
                if attr == "to_apply":
                    kinds[child] = "applied"
                elif ins.opcode == "fusion" or kinds[parent] == "fusion":
                    kinds[child] = "fusion"
                else:
                    kinds[child] = kinds[parent] if kinds[parent] != "entry" else "control"
                fusion_of[child] = ins.name if ins.opcode == "fusion" else fusion_of[parent]
                queue.append(child)
    for name in module.computations:
        kinds.setdefault(name, "control")
        fusion_of.setdefault(name, None)
    return kinds, fusion_of


# ---------------------------------------------------------------- extraction


def _ints(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"-?\d+", text)) if text else ()


def _unquote(text: str | None) -> str | None:
    return text.strip().strip('"') if text is not None else None


def _operand(ins: Instruction, i: int) -> ArrayShape | None:
    if i >= len(ins.operand_shapes):
        return None
    s = ins.operand_shapes[i]
    return s if isinstance(s, ArrayShape) else first_array(s)


def _permutes(ins: Instruction) -> bool | None:
    src, dst = _operand(ins, 0), first_array(ins.shape)
    if src is None or dst is None:
        return None
    if ins.opcode == "transpose":
        perm = _ints(ins.attrs.get("dimensions"))
        if len(perm) != len(dst.dims):
            return None
        # result dim i is operand dim perm[i]; equal memory order means a bitcast.
        return tuple(perm[d] for d in dst.major_to_minor) != src.major_to_minor
    if ins.opcode == "copy":
        return src.major_to_minor != dst.major_to_minor
    return False


def _data_move(ins: Instruction, fusion: str | None) -> DataMoveOp:
    operand_bytes = [shape_bytes(s) for s in ins.operand_shapes]
    bytes_in = None if any(b is None for b in operand_bytes) else sum(operand_bytes)
    dims = _ints(ins.attrs.get("dimensions")) if ins.opcode == "transpose" else None
    return DataMoveOp(
        name=ins.name,
        opcode=ins.opcode,
        computation=ins.computation,
        fusion=fusion,
        operand=_operand(ins, 0),
        result=first_array(ins.shape),
        bytes_in=bytes_in if ins.operand_shapes else None,
        bytes_out=shape_bytes(ins.shape),
        permutes_memory=_permutes(ins),
        dimensions=dims,
    )


def _is_conv(ins: Instruction) -> bool:
    if ins.opcode == "convolution":
        return True
    target = (_unquote(ins.attrs.get("custom_call_target")) or "").lower()
    return ins.opcode == "custom-call" and "conv" in target


def _is_dot(ins: Instruction) -> bool:
    if ins.opcode == "dot":
        return True
    target = (_unquote(ins.attrs.get("custom_call_target")) or "").lower()
    return ins.opcode == "custom-call" and ("gemm" in target or "matmul" in target)


def _conv(ins: Instruction, fusion: str | None) -> ConvOp:
    labels = ins.attrs.get("dim_labels")
    lhs, rhs, out = _operand(ins, 0), _operand(ins, 1), first_array(ins.shape)
    logical = physical = None
    if labels:
        logical = decode_dim_labels(labels)
        physical = {
            "input": physical_order(logical["input"], lhs),
            "kernel": physical_order(logical["kernel"], rhs),
            "output": physical_order(logical["output"], out),
        }
    return ConvOp(
        name=ins.name,
        opcode=ins.opcode,
        target=_unquote(ins.attrs.get("custom_call_target")),
        computation=ins.computation,
        fusion=fusion,
        dim_labels=labels,
        lhs=lhs,
        rhs=rhs,
        out=out,
        feature_group_count=int(ins.attrs.get("feature_group_count", 1)),
        batch_group_count=int(ins.attrs.get("batch_group_count", 1)),
        window=parse_window(ins.attrs.get("window")),
        logical=logical,
        physical=physical,
    )


def _dot(ins: Instruction, fusion: str | None) -> DotOp:
    return DotOp(
        name=ins.name,
        opcode=ins.opcode,
        target=_unquote(ins.attrs.get("custom_call_target")),
        computation=ins.computation,
        fusion=fusion,
        lhs=_operand(ins, 0),
        rhs=_operand(ins, 1),
        out=first_array(ins.shape),
        lhs_contracting_dims=_ints(ins.attrs.get("lhs_contracting_dims")),
        rhs_contracting_dims=_ints(ins.attrs.get("rhs_contracting_dims")),
        lhs_batch_dims=_ints(ins.attrs.get("lhs_batch_dims")),
        rhs_batch_dims=_ints(ins.attrs.get("rhs_batch_dims")),
    )


def _fusion_kind(ins: Instruction) -> str:
    kind = ins.attrs.get("kind", "?")
    if kind == "kCustom":
        m = re.search(r'"?kind"?\s*:\s*"([^"]+)"', ins.attrs.get("backend_config", ""))
        if m:
            return f"kCustom({m.group(1)})"
    return kind


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
            "dots": len(self.dots),
            "custom_calls": len(self.custom_calls),
        }

    def conv_layouts(self) -> dict[str, int]:
        """How many convs run in each physical layout, e.g. ``{"NHWC*HWIO->NHWC": 20}``."""
        counter = collections.Counter()
        for c in self.convolutions:
            p = c.physical
            key = f"{p['input']}*{p['kernel']}->{p['output']}" if p else "unknown"
            counter[key] += 1
        return dict(counter)

    def operand_dtypes(self) -> dict[str, dict[str, int]]:
        """How many convolutions and dots run on each operand/result dtype combination,
        e.g. ``{"convolutions": {"f32*f32->f32": 20}, "dots": {"bf16*bf16->f32": 3}}``: on
        CPU a bf16 conv shows up as f32 (XLA converts its operands), a bf16 GEMM as bf16."""

        def key(op) -> str:
            ins = "*".join(s.dtype if s else "?" for s in (op.lhs, op.rhs))
            return f"{ins}->{op.out.dtype if op.out else '?'}"

        return {
            "convolutions": dict(collections.Counter(key(c) for c in self.convolutions)),
            "dots": dict(collections.Counter(key(d) for d in self.dots)),
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
            f"  convolutions: {t['convolutions']} {self.conv_layouts()}; dots: {t['dots']}; "
            f"custom-calls: {t['custom_calls']}",
            f"  operand dtypes: {self.operand_dtypes()}",
        ]
        return "\n".join(lines)


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
                fusion_kinds[_fusion_kind(ins)] += 1
            if ins.opcode in ("transpose", "copy", "convert"):
                found[ins.opcode].append(_data_move(ins, fusion))
            if _is_conv(ins):
                found["conv"].append(_conv(ins, fusion))
            elif _is_dot(ins):
                found["dot"].append(_dot(ins, fusion))
            if ins.opcode == "custom-call":
                target = _unquote(ins.attrs.get("custom_call_target")) or "?"
                found["custom"].append(
                    CustomCallOp(ins.name, target, name, fusion, ins.operand_shapes, ins.shape)
                )
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
