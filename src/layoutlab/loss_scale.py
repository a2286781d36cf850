"""Loss scaling for float16 training, with ``torch.amp.GradScaler``'s update rule.

Three frozen dataclasses share one interface: ``scale(tree)`` multiplies the loss,
``unscale(tree)`` divides the gradients, ``adjust(grads_finite)`` returns the next loss scale.
They are pytrees: the running state (``loss_scale``, ``counter``) is data, every
hyperparameter is static metadata, so a ``jax.jit`` round trip keeps all of them.

Dtypes, under strict promotion:

- ``scale`` keeps each leaf's dtype. Half leaves are multiplied in float32 and cast back, so
  a scale above 65504 does not become ``inf`` before it touches the loss (it still
  overflows if the *product* does, which is what the dynamic scale is there to detect).
  Compute the loss in float32: the cotangent of a float16 loss is the scale itself, which
  overflows float16 for any scale above 65504.
- ``unscale`` returns float16/bfloat16 leaves as float32: the unscaled gradient is exactly
  the value that underflows half precision, so casting back would undo the scaling. Pass
  ``keep_dtype=True`` when the optimizer state is in half precision. All three classes do
  this, so switching loss scales never changes gradient dtypes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "NoOpLossScale",
    "StaticLossScale",
    "DynamicLossScale",
    "LossScale",
    "all_finite",
    "get_loss_scale",
]

_F32 = jnp.float32
_NUMBER = (int, float, np.integer, np.floating)
_F32_MAX = float(np.finfo(np.float32).max)


def _is_float_leaf(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jnp.inexact)


def _is_half(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating) and np.dtype(dtype).itemsize < 4


def _scale_leaf(x, scale):
    if not _is_float_leaf(x):
        return x
    if _is_half(x.dtype):
        return (x.astype(_F32) * scale).astype(x.dtype)
    return x * scale.astype(x.dtype)


def _unscale_leaf(x, scale, keep_dtype: bool):
    if not _is_float_leaf(x):
        return x
    if _is_half(x.dtype):
        # Multiply by the reciprocal, as GradScaler does (exact for power-of-two scales).
        out = x.astype(_F32) * (1 / scale)
        return out.astype(x.dtype) if keep_dtype else out
    return x * (1 / scale.astype(x.dtype))


def _as_array(value, dtype, name: str):
    """Python/NumPy numbers become arrays; anything else (tracers, arrays, the placeholders
    JAX puts in while unflattening) passes through untouched."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got a bool.")
    if isinstance(value, _NUMBER):
        if dtype == _F32 and not 0 < value <= _F32_MAX:
            raise ValueError(f"{name} must be positive and finite in float32, got {value}.")
        return jnp.asarray(value, dtype)
    if isinstance(value, np.ndarray):
        return jnp.asarray(value, dtype)
    return value


class _ScaleOps:
    """``scale``/``unscale`` shared by every loss scale; subclasses provide ``loss_scale``."""

    loss_scale: Any

    def scale(self, tree):
        """Multiplies every floating leaf by the loss scale, keeping its dtype."""
        s = jnp.asarray(self.loss_scale, _F32)
        return jax.tree.map(lambda x: _scale_leaf(x, s), tree)

    def unscale(self, tree, *, keep_dtype: bool = False):
        """Divides every floating leaf by the loss scale; half leaves come back float32."""
        s = jnp.asarray(self.loss_scale, _F32)
        return jax.tree.map(lambda x: _unscale_leaf(x, s, keep_dtype), tree)


@dataclasses.dataclass(frozen=True, eq=False)
class NoOpLossScale(_ScaleOps):
    """No scaling; ``unscale`` still upcasts half leaves, like the other loss scales."""

    @property
    def loss_scale(self) -> jax.Array:
        return jnp.ones([], _F32)

    def scale(self, tree):
        return tree

    def adjust(self, grads_finite) -> NoOpLossScale:
        del grads_finite
        return self


@dataclasses.dataclass(frozen=True, eq=False)
class StaticLossScale(_ScaleOps):
    """A fixed loss scale."""

    loss_scale: Any

    def __post_init__(self):
        object.__setattr__(self, "loss_scale", _as_array(self.loss_scale, _F32, "loss_scale"))

    def adjust(self, grads_finite) -> StaticLossScale:
        del grads_finite
        return self


@dataclasses.dataclass(frozen=True, eq=False)
class DynamicLossScale(_ScaleOps):
    """``torch.amp.GradScaler``'s dynamic scale, with optional ``[min, max]`` clamps.

    ``factor`` is GradScaler's ``growth_factor``, ``backoff`` its ``backoff_factor`` and
    ``period`` its ``growth_interval``; ``counter`` is its growth tracker.
    """

    loss_scale: Any = 2.0**16
    counter: Any = 0
    period: int = 2000
    factor: float = 2.0
    backoff: float = 0.5
    min_loss_scale: float = 1.0
    max_loss_scale: float = 2.0**24

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)
        if not isinstance(self.period, (int, np.integer)) or isinstance(self.period, bool):
            raise ValueError(f"period must be an int, got {self.period!r}.")
        if not 1 <= self.period < 2**31:
            raise ValueError(f"period must be in [1, 2**31), got {self.period}.")
        set_("period", int(self.period))
        for name in ("factor", "backoff", "min_loss_scale", "max_loss_scale"):
            value = getattr(self, name)
            if not isinstance(value, _NUMBER) or isinstance(value, bool):
                raise ValueError(f"{name} must be a number, got {value!r}.")
            set_(name, float(value))
        # GradScaler asserts the same two bounds.
        if not self.factor > 1.0:
            raise ValueError(f"factor (growth) must be > 1, got {self.factor}.")
        if not 0.0 < self.backoff < 1.0:
            raise ValueError(f"backoff must be in (0, 1), got {self.backoff}.")
        if not 0.0 < self.min_loss_scale <= self.max_loss_scale <= _F32_MAX:
            raise ValueError(
                "Need 0 < min_loss_scale <= max_loss_scale <= float32 max; got "
                f"min_loss_scale={self.min_loss_scale}, max_loss_scale={self.max_loss_scale}."
            )
        # Checks of the state run only on concrete numbers: unflattening passes tracers.
        if isinstance(self.loss_scale, _NUMBER) and not (
            self.min_loss_scale <= self.loss_scale <= self.max_loss_scale
        ):
            raise ValueError(
                f"loss_scale={self.loss_scale} is outside [min_loss_scale, max_loss_scale] = "
                f"[{self.min_loss_scale}, {self.max_loss_scale}]."
            )
        if isinstance(self.counter, _NUMBER) and not 0 <= self.counter < self.period:
            raise ValueError(f"counter must be in [0, period={self.period}), got {self.counter}.")
        set_("loss_scale", _as_array(self.loss_scale, _F32, "loss_scale"))
        set_("counter", _as_array(self.counter, jnp.int32, "counter"))

    def adjust(self, grads_finite) -> DynamicLossScale:
        """GradScaler's ``_amp_update_scale_``, then the clamp to ``[min, max]``.

        Non-finite: ``scale *= backoff``, ``counter = 0``. Finite: ``counter += 1``; on reaching
        ``period`` the scale grows by ``factor`` unless that overflows float32, and the
        counter goes back to 0. The factors multiply in float32, which equals GradScaler's
        double-precision product rounded to float32 whenever the factor is exactly
        representable in float32 (every power of two, 1.5, 0.75, ...).
        """
        finite = jnp.asarray(grads_finite)
        if finite.shape != () or finite.dtype != jnp.bool_:
            raise ValueError(
                f"grads_finite must be a bool scalar (see all_finite), got {finite.dtype}"
                f"{list(finite.shape)}."
            )
        scale = jnp.asarray(self.loss_scale, _F32)
        successful = self.counter + 1
        reached = successful == self.period
        grown = scale * jnp.asarray(self.factor, _F32)
        grown = jnp.where(jnp.isfinite(grown), grown, scale)
        new_scale = jnp.where(
            finite,
            jnp.where(reached, grown, scale),
            scale * jnp.asarray(self.backoff, _F32),
        )
        new_scale = jnp.clip(
            new_scale,
            jnp.asarray(self.min_loss_scale, _F32),
            jnp.asarray(self.max_loss_scale, _F32),
        )
        new_counter = jnp.where(finite & ~reached, successful, jnp.zeros_like(successful))
        return dataclasses.replace(self, loss_scale=new_scale, counter=new_counter)


for _cls, _data in (
    (NoOpLossScale, []),
    (StaticLossScale, ["loss_scale"]),
    (DynamicLossScale, ["loss_scale", "counter"]),
):
    jax.tree_util.register_dataclass(
        _cls,
        data_fields=_data,
        meta_fields=[f.name for f in dataclasses.fields(_cls) if f.name not in _data],
    )

LossScale = NoOpLossScale | StaticLossScale | DynamicLossScale


def all_finite(tree) -> jax.Array:
    """True when no floating leaf holds an inf or NaN; integer and bool leaves count as finite."""
    checks = []
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, (float, complex, np.floating)):
            leaf = jnp.asarray(leaf)
        if _is_float_leaf(leaf):
            checks.append(jnp.all(jnp.isfinite(leaf)))
    if not checks:
        return jnp.asarray(True)
    return jnp.all(jnp.stack(checks))


_FORMS = "use 'none', 'static:<scale>' (e.g. 'static:1024'), 'dynamic' or 'dynamic:<initial>'"


def _parse_scale_value(text: str, scale: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"Loss scale {scale!r}: {text!r} is not a number; {_FORMS}.") from None
    if not (0 < value <= _F32_MAX):
        raise ValueError(
            f"Loss scale {scale!r}: the scale must be positive and finite in float32, got {value}."
        )
    return value


def get_loss_scale(scale: str | LossScale | None, /) -> LossScale:
    """The ``LossScale`` of a loss-scale name: ``None``/``"none"``, ``"static:1024"``,
    ``"dynamic"`` or ``"dynamic:65536"``; a ``LossScale`` as it is."""
    if scale is None or isinstance(scale, (NoOpLossScale, StaticLossScale, DynamicLossScale)):
        return NoOpLossScale() if scale is None else scale
    if not isinstance(scale, str):
        raise TypeError(
            f"A loss scale must be a LossScale or a loss-scale name (str), "
            f"got {type(scale).__name__}."
        )
    kind, sep, value = scale.strip().lower().partition(":")
    kind, value = kind.strip(), value.strip()
    if kind == "none" and not sep:
        return NoOpLossScale()
    if kind == "static":
        if not value:
            raise ValueError(f"Loss scale {scale!r} needs a value, e.g. 'static:1024'.")
        return StaticLossScale(_parse_scale_value(value, scale))
    if kind == "dynamic":
        if not sep:
            return DynamicLossScale()
        if not value:
            raise ValueError(f"Loss scale {scale!r} has an empty value; {_FORMS}.")
        return DynamicLossScale(loss_scale=_parse_scale_value(value, scale))
    raise ValueError(f"Unknown loss scale {scale!r}; {_FORMS}.")
