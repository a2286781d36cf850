"""What a model registers with: its ``ModelSpec`` (name, builder, default input, tiny
variant, argument ranges) and the ``register`` decorator the architecture modules use.

The table lives here, apart from ``registry`` (which looks models up and builds them), so an
architecture module registers without importing the registry that imports it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from layoutlab.layout import Layout, channels_first, channels_last, parse_layout

if TYPE_CHECKING:
    from flax import nnx

__all__ = [
    "POSITIVE",
    "PROBABILITY",
    "SPECS",
    "ModelSpec",
    "Range",
    "add_spec",
    "register",
    "resolve_layout",
]


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a numeric builder argument may take: ``low <= v < high`` by default
    (``low_open``/``high_closed`` change the ends; None leaves a side unbounded)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_closed: bool = False

    def __contains__(self, value) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        if self.high is not None:
            return value <= self.high if self.high_closed else value < self.high
        return True

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        left = "(" if self.low_open else "["
        right = "]" if self.high_closed else ")"
        return f"in {left}{self.low:g}, {self.high:g}{right}"


POSITIVE = Range(1)  # widths, channel and unit counts
PROBABILITY = Range(0.0, 1.0)  # dropout rates: 1 would drop everything


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    builder: Callable[..., nnx.Module]
    description: str
    num_spatial: int = 2
    task: str = "classification"
    # (spatial..., channels): an input size the model is meant for, used by defaults.
    default_input: tuple[int, ...] = (32, 32, 3)
    # kwargs that make a tiny variant for fast tests and notebooks.
    tiny: dict = dataclasses.field(default_factory=dict)
    # Numeric builder arguments and the Range each must lie in (checked before a run builds).
    ranges: dict = dataclasses.field(default_factory=dict)

    @property
    def per_pixel(self) -> bool:
        """Whether the model's logits and labels are per pixel (segmentation), the classes
        on the layout's channel axis, rather than one row per image."""
        return self.task == "segmentation"

    def input_shape(self, batch: int, layout: Layout | str, spatial=None, channels=None):
        lay = resolve_layout(layout, self.num_spatial)
        spatial = tuple(spatial) if spatial is not None else self.default_input[:-1]
        channels = channels if channels is not None else self.default_input[-1]
        return lay.shape(batch, channels, spatial)


# Every registered model by name: the architecture modules' (added as they are imported,
# which ``registry`` does on its first lookup) and those added later through ``registry``.
SPECS: dict[str, ModelSpec] = {}


def add_spec(name: str, builder, **spec_kw) -> None:
    if name in SPECS:
        raise ValueError(f"Model {name!r} is registered twice.")
    SPECS[name] = ModelSpec(name=name, builder=builder, **spec_kw)


def register(name: str, **spec_kw):
    """Decorator of an architecture module's builder: adds it under ``name``."""

    def wrap(builder):
        add_spec(name, builder, **spec_kw)
        return builder

    return wrap


def resolve_layout(layout: Layout | str, num_spatial: int) -> Layout:
    """``"NHWC"`` asked of a 3D model means its channels-last layout, ``NDHWC``."""
    lay = parse_layout(layout)
    return channels_last(num_spatial) if lay.is_channels_last else channels_first(num_spatial)
