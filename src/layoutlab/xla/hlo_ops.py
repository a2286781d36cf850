"""The op records an HLO report lists: transposes, copies and converts (``DataMoveOp``),
convolutions (``ConvOp``, with their ``Window``), dots (``DotOp``) and custom-calls
(``CustomCallOp``); each turns into JSON-ready dicts with ``to_dict()``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from layoutlab.xla.hlo_parse import ArrayShape

__all__ = [
    "ConvOp",
    "CustomCallOp",
    "DataMoveOp",
    "DotOp",
    "Window",
    "dtype_trio",
    "layout_trio",
]


def layout_trio(layouts: Mapping[str, str | None] | None) -> str | None:
    """``{"input": "NCHW", "kernel": "OIHW", "output": "NCHW"}`` -> ``"NCHW*OIHW->NCHW"``."""
    if not layouts:
        return None
    return f"{layouts['input']}*{layouts['kernel']}->{layouts['output']}"


def dtype_trio(op: ConvOp | DotOp) -> str:
    """Operand and result dtypes of a conv or dot, e.g. ``"bf16*bf16->f32"``."""
    ins = "*".join(s.dtype if s else "?" for s in (op.lhs, op.rhs))
    return f"{ins}->{op.out.dtype if op.out else '?'}"


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


class _FusedRecord:
    """``nested`` and ``to_dict`` for a record whose ``fusion`` names the fusion running it."""

    fusion: str | None

    @property
    def nested(self) -> bool:
        return self.fusion is not None

    def to_dict(self) -> dict:
        d = _record_dict(self)
        d["nested"] = self.nested
        return d


@dataclasses.dataclass(frozen=True)
class DataMoveOp(_FusedRecord):
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
        d = super().to_dict()
        d.update(bytes_moved=self.bytes_moved, conversion=self.conversion)
        return d


@dataclasses.dataclass(frozen=True)
class ConvOp(_FusedRecord):
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

    def describe(self) -> str:
        """One line: ``NCHW*OIHW->NCHW (physical NHWC*HWIO->NHWC) f32*f32->f32``."""
        return (
            f"{layout_trio(self.logical) or '?'} "
            f"(physical {layout_trio(self.physical) or '?'}) {dtype_trio(self)}"
        )


@dataclasses.dataclass(frozen=True)
class DotOp(_FusedRecord):
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
