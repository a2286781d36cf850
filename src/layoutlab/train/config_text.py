"""Text values of ``TrainConfig`` fields (``--set FIELD=VALUE``), parsed by the field's type.

Standard library only, like ``train.config``: ``layoutlab train --help`` imports it.
"""

from __future__ import annotations

import json

from layoutlab.train.image_size import parse_image_size

__all__ = ["parse_field_text", "parse_kwarg", "parse_option"]

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def parse_field_text(name: str, text: str, base: type, optional: bool):
    """Parses ``text`` as the type ``base`` of field ``name`` (``optional``: None allowed)."""
    raw = text.strip()
    if name == "loss_scale":  # "none" is a loss scale of its own, not "not given"
        return raw
    if optional and raw.lower() in ("none", "null", "auto"):
        return None
    if name == "image_size":  # 64, 64,48, 64x48 or [64, 48]
        return parse_image_size(raw)
    try:
        if base is bool:
            if raw.lower() in _TRUE:
                return True
            if raw.lower() in _FALSE:
                return False
            raise ValueError
        if base is int:
            return int(raw)
        if base is float:
            return float(raw)
        if base is list:  # numbers: 30,60 or [30, 60]
            items = raw.strip("[]").replace(",", " ").split()
            return [int(x) if x.lstrip("-").isdigit() else float(x) for x in items]
        if base is dict:
            value = json.loads(raw)
            if not isinstance(value, dict):
                raise ValueError
            return value
    except ValueError:
        kind = {
            bool: "true/false",
            int: "an integer",
            float: "a number",
            list: "numbers separated by commas",
        }.get(base, 'a JSON object such as {"width": 8}')
        extra = " (or none)" if optional else ""
        raise ValueError(f"Bad value for {name}: {text!r} is not {kind}{extra}.") from None
    return raw


def parse_kwarg(text: str):
    """A model kwarg value: JSON when it parses (8, 0.5, true), else the string itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text.strip()


def parse_option(text: str) -> bool | int | float | str:
    """An XLA option value: true/false (any case) -> bool, then int, then float, else str."""
    raw = text.strip()
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw
