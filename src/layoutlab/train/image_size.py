"""A run's ``image_size`` in its forms: the stored ``[H, W]`` and the flag and ``--set``
text (``64``, ``64,48``, ``64x48``, ``[64, 48]``). Standard library only: the config module
that reads it builds ``layoutlab train --help``."""

from __future__ import annotations

from argparse import ArgumentTypeError

from layoutlab.arguments import parse_image_size as parse_image_size_flag

__all__ = ["image_size_value", "parse_image_size"]


def image_size_value(value) -> list:
    """``64`` or ``(64, 48)`` -> ``[64, 64]`` / ``[64, 48]``; anything else is an error."""
    sizes = [value, value] if isinstance(value, int) else value
    ok = isinstance(sizes, (list, tuple)) and len(sizes) == 2
    ok = ok and all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes)
    if not ok:
        raise ValueError(
            f"image_size must be a positive integer or [H, W] of positive integers, got "
            f"{value!r}; e.g. image_size=64 or image_size=64,48."
        )
    return list(sizes)


def parse_image_size(text: str) -> list:
    """``64``, ``64,48``, ``64x48`` (the ``--image-size`` forms, ``arguments.parse_image_size``)
    or ``[64, 48]`` (``--set`` text) -> ``[H, W]``."""
    inner = text.strip()
    if inner.startswith("[") and inner.endswith("]"):
        inner = inner[1:-1]
    try:
        return image_size_value(list(parse_image_size_flag(inner) * 2)[:2])
    except ArgumentTypeError:
        raise ValueError(
            f"Bad value for image_size: {text!r} is not H,W, HxW or one size (e.g. 64 or 64,48)."
        ) from None
