"""The model registry: names, what each model expects, and ``create``."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from collections.abc import Callable

from flax import nnx

from layoutlab.fast_defaults import resolve_activation_storage, resolve_kernel_storage
from layoutlab.layout import Layout, channels_first, channels_last, parse_layout
from layoutlab.nn.conv_config import check_conv_options, configure_convs
from layoutlab.precision import get_policy


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

    def input_shape(self, batch: int, layout: Layout | str, spatial=None, channels=None):
        lay = resolve_layout(layout, self.num_spatial)
        spatial = tuple(spatial) if spatial is not None else self.default_input[:-1]
        channels = channels if channels is not None else self.default_input[-1]
        return lay.shape(batch, channels, spatial)


_REGISTRY: dict[str, ModelSpec] = {}
# The architecture modules register themselves on import; they are imported on the first
# lookup, so `import layoutlab.models` (the CLI builds its parser from it) loads no flax.
BUILTIN_MODULES = ("cnn3d", "mobilenet", "resnet", "small_cnn", "unet", "vgg")
_builtins_loaded: list[bool] = []


def _registry() -> dict[str, ModelSpec]:
    if not _builtins_loaded:
        _builtins_loaded.append(True)
        for module in BUILTIN_MODULES:
            importlib.import_module(f"layoutlab.models.{module}")
    return _REGISTRY


def register(name: str, **spec_kw):
    def wrap(builder):
        if name in _registry():
            raise ValueError(f"Model {name!r} is registered twice.")
        _REGISTRY[name] = ModelSpec(name=name, builder=builder, **spec_kw)
        return builder

    return wrap


def unregister(name: str) -> None:
    """Remove a model added with ``register`` (for test-only and experimental models)."""
    spec(name)  # raises with the known names if it is not there
    del _registry()[name.strip().lower()]


def names() -> list[str]:
    return sorted(_registry())


def spec(name: str) -> ModelSpec:
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in _registry():
        raise ValueError(f"Unknown model {name!r}; known models are: {', '.join(names())}.")
    return _REGISTRY[key]


def resolve_layout(layout: Layout | str, num_spatial: int) -> Layout:
    """``"NHWC"`` asked of a 3D model means its channels-last layout, ``NDHWC``."""
    lay = parse_layout(layout)
    return channels_last(num_spatial) if lay.is_channels_last else channels_first(num_spatial)


def _accepted_options(builder) -> list[str]:
    target = builder.func if isinstance(builder, functools.partial) else builder
    fn = target.__init__ if isinstance(target, type) else target
    return [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"
    ]


def create(
    name: str,
    *,
    num_classes: int = 10,
    layout: Layout | str = Layout.NHWC,
    policy=None,
    rngs: nnx.Rngs | None = None,
    kernel_storage: str = "auto",
    activation_storage: str = "auto",
    **kw,
) -> nnx.Module:
    """Build a registered model. Extra keywords go to its builder (``stem``, ``width``, ...).

    ``kernel_storage`` and ``activation_storage`` (``nn.configure_convs``) default to
    ``"auto"``, the fast defaults of JAX's default backend (``fast_defaults``): on CPU, conv
    kernels stored ``HWIO`` and a channels-first model computing channels-last inside, with
    the same weights, inputs and outputs as ``"layout"`` for both (the model's own orders).
    """
    s = spec(name)
    kernel_storage = resolve_kernel_storage(kernel_storage)
    activation_storage = resolve_activation_storage(activation_storage)
    check_conv_options(None, kernel_storage, activation_storage)
    params = _accepted_options(s.builder)
    unknown = sorted(set(kw) - set(params))
    if unknown:
        allowed = [p for p in params if p not in ("num_classes", "layout", "policy", "rngs")]
        allowed += ["kernel_storage", "activation_storage"]
        raise ValueError(
            f"Model {s.name!r} got unknown options {unknown}; it accepts: {', '.join(allowed)}."
        )
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}.")
    model = s.builder(
        num_classes=num_classes,
        layout=resolve_layout(layout, s.num_spatial),
        policy=get_policy(policy),
        rngs=rngs if rngs is not None else nnx.Rngs(0),
        **kw,
    )
    return configure_convs(
        model, kernel_storage=kernel_storage, activation_storage=activation_storage
    )
