"""A run's ``image_size`` in its forms: the stored ``[H, W]`` and the flag and ``--set``
text (``64``, ``64,48``, ``64x48``, ``[64, 48]``). Standard library only: the config module
that reads it builds ``layoutlab train --help``."""

from __future__ import annotations

import re

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
    """``64``, ``64,48``, ``64x48`` or ``[64, 48]`` (flag and ``--set`` text) -> ``[H, W]``."""
    parts = [p for p in re.split(r"[\s,x\[\]]+", text.strip().lower()) if p]
    try:
        return image_size_value([int(p) for p in parts] if len(parts) != 1 else int(parts[0]))
    except ValueError:
        raise ValueError(
            f"Bad value for image_size: {text!r} is not H,W or one size (e.g. 64 or 64,48)."
        ) from None
