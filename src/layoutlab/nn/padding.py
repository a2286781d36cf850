"""Normalising the padding argument shared by conv and pooling layers."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["Padding", "normalize_padding", "normalize_tuple", "same_padding"]


Padding = str | int | Sequence[int] | Sequence[tuple[int, int]]


def normalize_tuple(value: int | Sequence[int], n: int, name: str) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * n
    value = tuple(int(v) for v in value)
    if len(value) != n:
        raise ValueError(f"{name} needs {n} values (one per spatial dim), got {value}.")
    return value


def normalize_padding(padding: Padding, n: int) -> str | tuple[tuple[int, int], ...]:
    """``"SAME"``/``"VALID"``, an int, one int per dim, or one ``(lo, hi)`` pair per dim."""
    if isinstance(padding, str):
        upper = padding.upper()
        if upper not in ("SAME", "VALID"):
            raise ValueError(
                f"Unknown padding {padding!r}; use 'SAME', 'VALID', an int, one int per "
                "spatial dim, or one (lo, hi) pair per spatial dim."
            )
        return upper
    if isinstance(padding, int):
        return ((padding, padding),) * n
    items = list(padding)
    if len(items) != n:
        raise ValueError(f"padding needs {n} entries (one per spatial dim), got {padding!r}.")
    if all(isinstance(p, int) for p in items):
        return tuple((p, p) for p in items)
    pairs = tuple(tuple(int(v) for v in p) for p in items)
    if any(len(p) != 2 for p in pairs):
        raise ValueError(f"padding pairs must be (lo, hi), got {padding!r}.")
    return pairs


def same_padding(size: int, kernel: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """XLA's SAME rule: output ``ceil(size / stride)``, extra padding on the high side."""
    out = -(-size // stride)
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return (total // 2, total - total // 2)
