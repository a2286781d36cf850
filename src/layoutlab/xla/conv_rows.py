"""Each convolution of a compiled program, the layouts it was written in next to those XLA
runs it in: the convs of the pre-optimization HLO paired with those of the optimized HLO
(``match_convs``) and shown as a table (``format_conv_rows``)."""

from __future__ import annotations

import dataclasses

from layoutlab.xla.hlo import HloReport
from layoutlab.xla.hlo_ops import ConvOp, dtype_trio, layout_trio

__all__ = ["ConvRow", "format_conv_rows", "match_convs"]


@dataclasses.dataclass(frozen=True)
class ConvRow:
    """One convolution: the layouts the program wrote next to those XLA runs."""

    name: str | None  # instruction in the optimized HLO
    fusion: str | None
    logical: str | None  # e.g. "NCHW*OIHW->NCHW", from the pre-optimization HLO
    physical: str | None  # e.g. "NHWC*HWIO->NHWC", memory order in the optimized HLO
    dtypes_before: str | None  # e.g. "bf16*bf16->f32" as written
    dtypes_after: str | None  # as run, e.g. "f32*f32->f32" on CPU
    shapes: str  # logical shapes as written, "lhs * rhs -> out"
    window: str  # as written
    note: str | None = None  # set when XLA rewrote the conv beyond its layout

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _roles(letters: str | None, shape) -> tuple:
    if letters is None or shape is None or len(letters) != len(shape.dims):
        return ()
    return tuple(sorted(zip(letters, shape.dims, strict=True)))


def _signature(c: ConvOp, level: int) -> tuple:
    """What survives XLA's rewrites of a conv, from most to least specific.

    0 and 1: the size of each axis role (N, C, H, ...), unchanged when XLA permutes a conv's
    dims, with (0) or without (1) the window; 2: the multiset of all operand and result dims,
    unchanged when XLA swaps the operands (it does for kernels larger than their input).
    """
    if level == 2:
        return tuple(sorted(d for s in (c.lhs, c.rhs, c.out) if s for d in s.dims))
    lg = c.logical or {}
    sig = (
        _roles(lg.get("input"), c.lhs),
        _roles(lg.get("kernel"), c.rhs),
        _roles(lg.get("output"), c.out),
        c.feature_group_count,
        c.batch_group_count,
    )
    if level == 0 and c.window is not None:
        sig += (c.window.size, c.window.stride, c.window.pad, c.window.rhs_dilate)
    return sig


def _window(c: ConvOp) -> str:
    w = c.window
    if w is None:
        return "?"
    text = "x".join(map(str, w.size))
    if any(s != 1 for s in w.stride):
        text += " stride " + "x".join(map(str, w.stride))
    if any(p != (0, 0) for p in w.pad):
        text += " pad " + "x".join(f"{lo}_{hi}" for lo, hi in w.pad)
    for label, values in (("lhs_dilate", w.lhs_dilate), ("rhs_dilate", w.rhs_dilate)):
        if any(v != 1 for v in values):
            text += f" {label} " + "x".join(map(str, values))
    return text


def _dims(c: ConvOp) -> str:
    def d(s):
        return "[" + ",".join(map(str, s.dims)) + "]" if s else "?"

    return f"{d(c.lhs)} * {d(c.rhs)} -> {d(c.out)}"


def match_convs(before: HloReport | None, after: HloReport | None) -> list[ConvRow]:
    """Pair each conv of the pre-optimization HLO (program order) with the optimized conv it
    became.

    XLA renames and re-lays out convs, so they are paired by what a rewrite keeps (see
    ``_signature``); convs with equal signatures are interchangeable and are paired in
    order. A row whose roles XLA changed carries a ``note``; a conv XLA turned into other ops
    has no physical layout; one XLA made up has no logical layout.
    """
    if after is None:
        return []
    sources = list(before.convolutions) if before is not None else []
    pool = list(after.convolutions)
    pairs: dict[int, tuple[ConvOp, int]] = {}
    for level in (0, 1, 2):
        for i, src in enumerate(sources):
            if i in pairs:
                continue
            sig = _signature(src, level)
            for j, cand in enumerate(pool):
                if _signature(cand, level) == sig:
                    pairs[i] = (pool.pop(j), level)
                    break
    rows = []
    for i, src in enumerate(sources):
        if i not in pairs:
            rows.append(_row(src, None, "no convolution left in the optimized HLO"))
            continue
        conv, level = pairs[i]
        note = "rewritten by XLA: operands or axis roles changed" if level == 2 else None
        rows.append(_row(src, conv, note))
    return rows + [_row(None, conv, "made by XLA") for conv in pool]


def _row(src: ConvOp | None, conv: ConvOp | None, note: str | None = None) -> ConvRow:
    shown = src if src is not None else conv
    return ConvRow(
        name=conv.name if conv else None,
        fusion=conv.fusion if conv else None,
        logical=layout_trio(src.logical) if src else None,
        physical=layout_trio(conv.physical) if conv else None,
        dtypes_before=dtype_trio(src) if src else None,
        dtypes_after=dtype_trio(conv) if conv else None,
        shapes=_dims(shown),
        window=_window(shown),
        note=note,
    )


def format_conv_rows(rows: list[ConvRow]) -> str:
    """A text table: logical layout as written, physical as run, dtypes, shapes."""
    if not rows:
        return "(no convolutions)"
    header = ("#", "logical (program)", "physical (XLA)", "dtypes written", "dtypes run", "shapes")
    body = [
        (
            str(i),
            r.logical or "?",
            r.physical or "?",
            r.dtypes_before or "?",
            r.dtypes_after or "?",
            f"{r.shapes} {r.window}" + (f"  ({r.note})" if r.note else ""),
        )
        for i, r in enumerate(rows)
    ]
    widths = [max(len(row[k]) for row in [header, *body]) for k in range(len(header) - 1)]
    lines = []
    for row in [header, *body]:
        cells = [f"{cell:<{w}}" for cell, w in zip(row[:-1], widths, strict=True)]
        lines.append("  ".join([*cells, row[-1]]))
    return "\n".join(lines)
