"""Transposes by what they move: *kernel* transposes (an operand or result shaped like a conv
kernel parameter: the weights, which stay stored in the model's kernel order and so are
transposed on every call, or their gradients), *activation* ones and *other* ones."""

from __future__ import annotations

import jax

from layoutlab.xla.hlo import HloReport
from layoutlab.xla.hlo_ops import DataMoveOp

__all__ = ["conv_kernel_shapes", "count_conv_kernels", "transpose_kind", "transposes_by_kind"]


def _conv_kernels(params) -> list[tuple[int, ...]]:
    """The shape of each conv kernel parameter (leaves named ``kernel`` of rank >= 3)."""
    shapes = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = [str(getattr(k, "key", getattr(k, "name", ""))) for k in path]
        shape = tuple(getattr(leaf, "shape", ()))
        if "kernel" in names and len(shape) >= 3:
            shapes.append(shape)
    return shapes


def conv_kernel_shapes(params) -> set[tuple[int, ...]]:
    """The distinct shapes of the conv kernel parameters in ``params``."""
    return set(_conv_kernels(params))


def count_conv_kernels(params) -> int:
    """How many conv kernel parameters ``params`` holds (one per conv layer)."""
    return len(_conv_kernels(params))


def transpose_kind(op: DataMoveOp, kernel_shapes: set, rank: int) -> str:
    """``kernel`` (operand or result shaped like a conv kernel), ``activation`` (rank of the
    model's activations) or ``other``."""
    for s in (op.operand, op.result):
        if s is not None and tuple(s.dims) in kernel_shapes:
            return "kernel"
    if op.result is not None and len(op.result.dims) == rank:
        return "activation"
    return "other"


def transposes_by_kind(hlo: HloReport | None, kernel_shapes: set, rank: int) -> dict:
    """``{"kernel": {"count", "bytes"}, "activation": {...}, "other": {...}}``."""
    out = {k: {"count": 0, "bytes": 0} for k in ("kernel", "activation", "other")}
    for op in hlo.transposes if hlo is not None else []:
        kind = transpose_kind(op, kernel_shapes, rank)
        out[kind]["count"] += 1
        out[kind]["bytes"] += op.bytes_moved or 0
    return out
