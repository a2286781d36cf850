"""The names of the training-time augmentations, parsed without JAX (``train --help`` and the
config checks read them).

``auto_augment`` takes timm's text form: ``"trivial"`` (TrivialAugment-Wide) or
``"rand-mM-nN"`` (RandAugment: ``N`` ops per image, each at magnitude ``M`` of 0..10; either
part may be left out: ``m`` defaults to 10 and ``n`` to 2, as in timm).
"""

from __future__ import annotations

import dataclasses

__all__ = [
    "ERASING_MODES",
    "MAX_MAGNITUDE",
    "AutoAugmentPolicy",
    "parse_auto_augment",
]

MAX_MAGNITUDE = 10  # timm's _LEVEL_DENOM: magnitude M is the fraction M / 10 of each op's range
_DEFAULT_MAGNITUDE = 10
_DEFAULT_OPS = 2
_MAX_OPS = 10
# What an erased rectangle holds, in timm's names (--remode): "pixel" normal noise per value,
# "const" zeros (the data set's mean once images are normalized).
ERASING_MODES = ("pixel", "const")
_FORMS = "'trivial' or 'rand-mM-nN' (e.g. rand-m9-n2: 2 ops per image at magnitude 9 of 10)"


@dataclasses.dataclass(frozen=True)
class AutoAugmentPolicy:
    """``kind`` ``"trivial"`` (one op per image, its magnitude drawn) or ``"rand"``
    (``num_ops`` ops, each applied with probability 1/2 at ``magnitude`` of 10)."""

    kind: str
    num_ops: int = 1
    magnitude: int = _DEFAULT_MAGNITUDE

    @property
    def text(self) -> str:
        """The one spelling of the policy (what a run records): ``trivial``, ``rand-mM-nN``."""
        if self.kind == "trivial":
            return "trivial"
        return f"rand-m{self.magnitude}-n{self.num_ops}"


def parse_auto_augment(text: str) -> AutoAugmentPolicy:
    """The policy of ``text`` (see the module); ``ValueError`` naming the accepted forms."""
    if not isinstance(text, str):
        raise ValueError(f"auto_augment must be {_FORMS}, got {text!r}.")
    name, *parts = text.strip().lower().split("-")
    if name == "trivial" and not parts:
        return AutoAugmentPolicy("trivial")
    if name != "rand":
        raise ValueError(f"Unknown auto_augment {text!r}; use {_FORMS}.")
    values = {"m": _DEFAULT_MAGNITUDE, "n": _DEFAULT_OPS}
    for part in parts:
        key, digits = part[:1], part[1:]
        if key not in values or not digits.isdigit():
            raise ValueError(
                f"auto_augment {text!r}: {part!r} is not mM or nN (timm's other parts, mstd, "
                f"inc, mmax and p, are not supported); use {_FORMS}."
            )
        values[key] = int(digits)
    if values["m"] > MAX_MAGNITUDE:
        raise ValueError(
            f"auto_augment {text!r}: magnitude m{values['m']} is above {MAX_MAGNITUDE}, the "
            f"whole range of every op; use m0 to m{MAX_MAGNITUDE}."
        )
    if not 1 <= values["n"] <= _MAX_OPS:
        raise ValueError(
            f"auto_augment {text!r}: n{values['n']} ops per image; use n1 to n{_MAX_OPS}."
        )
    return AutoAugmentPolicy("rand", values["n"], values["m"])
