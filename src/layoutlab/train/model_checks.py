"""Checks of a config's model and its keyword arguments against the builder's signature.

The builders carry no annotations, so a keyword argument's type is judged by its default
(``width=32`` takes an integer); its range comes from the model's registration
(``ModelSpec.ranges``: ``dropout`` in [0, 1), widths >= 1). What neither can say the loop
finds by building the model abstractly before anything compiles.
"""

from __future__ import annotations

import functools
import inspect
import json
import math

from layoutlab import models

__all__ = ["builder_options", "check_model", "with_builder_defaults"]

# Builder arguments the loop sets itself (remat has its own field).
_RESERVED_KWARGS = ("num_classes", "layout", "policy", "rngs", "remat", "compute_layout")


def _builder_parameters(model: str) -> list[inspect.Parameter]:
    builder = models.spec(model).builder
    target = builder.func if isinstance(builder, functools.partial) else builder
    fn = target.__init__ if isinstance(target, type) else target
    bound = builder.keywords if isinstance(builder, functools.partial) else {}
    return [
        p.replace(default=bound[p.name]) if p.name in bound else p
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"
    ]


def builder_options(model: str) -> list[str]:
    """Keyword arguments the model's builder accepts."""
    return [p.name for p in _builder_parameters(model)]


def with_builder_defaults(model: str, model_kwargs: dict) -> dict:
    """``model_kwargs`` with every builder argument it leaves out at its default: what the
    builder is called with, so ``{"dropout": 0.0}`` and ``{}`` are one model."""
    defaults = {
        p.name: p.default
        for p in _builder_parameters(model)
        if p.default is not inspect.Parameter.empty and p.name not in _RESERVED_KWARGS
    }
    return {**defaults, **model_kwargs}


def _kwarg_kind(default) -> tuple[tuple[type, ...], str] | None:
    """The types a model keyword argument may take, judged by its default (the builders
    carry no annotations), or None when the default says nothing (None, no default)."""
    if isinstance(default, bool):
        return (bool,), "true or false"
    if isinstance(default, int):
        return (int,), "an integer"
    if isinstance(default, float):
        return (int, float), "a number"
    if isinstance(default, str):
        return (str,), "a string"
    if isinstance(default, (tuple, list)):
        return (tuple, list), "a list"
    return None


def _check_model_kwargs(model: str, model_kwargs: dict) -> None:
    defaults = {p.name: p.default for p in _builder_parameters(model)}
    ranges = models.spec(model).ranges
    for name, value in model_kwargs.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"model_kwargs.{name} must be finite, got {value!r}.")
        kind = _kwarg_kind(defaults[name])
        if kind is None:
            continue
        types_, what = kind
        wrong_bool = isinstance(value, bool) and bool not in types_
        if wrong_bool or not isinstance(value, types_):
            raise ValueError(
                f"model_kwargs.{name} of {model!r} must be {what} (its default is "
                f"{defaults[name]!r}), got {value!r}; e.g. --set model_kwargs.{name}="
                f"{json.dumps(defaults[name])}."
            )
        allowed = ranges.get(name)
        if allowed is not None and not isinstance(value, bool) and value not in allowed:
            raise ValueError(
                f"model_kwargs.{name} of {model!r} must be {allowed}, got {value!r}; "
                f"e.g. --set model_kwargs.{name}={json.dumps(defaults[name])}."
            )


def check_model(model: str, model_kwargs: dict, *, remat: bool) -> None:
    """Raises ``ValueError`` naming the fix where a run's ``model``, its ``model_kwargs`` or
    ``remat`` cannot build (checked before anything compiles)."""
    spec = models.spec(model)  # raises for an unknown name, listing the known ones
    if spec.task != "classification":
        raise ValueError(
            f"model={model!r} is a {spec.task} model, but every data set here is image "
            "classification; pick a classification model (e.g. small_cnn, resnet18)."
        )
    if spec.num_spatial != 2:
        raise ValueError(
            f"model={model!r} takes {spec.num_spatial}D inputs, but the data sets hold "
            "2D images; pick a 2D model."
        )
    accepted = builder_options(model)
    reserved = sorted(set(model_kwargs) & set(_RESERVED_KWARGS))
    if reserved:
        raise ValueError(
            f"model_kwargs may not set {reserved}: the trainer sets them (use the layout, "
            "precision, remat and activation_storage fields)."
        )
    unknown = sorted(set(model_kwargs) - set(accepted))
    if unknown:
        options = [a for a in accepted if a not in _RESERVED_KWARGS]
        raise ValueError(
            f"model_kwargs {unknown} are not options of {model!r}; it accepts: "
            f"{', '.join(options)}."
        )
    _check_model_kwargs(model, model_kwargs)
    if remat and "remat" not in accepted:
        with_remat = [n for n in models.names() if "remat" in builder_options(n)]
        raise ValueError(
            f"remat=True is not supported by {model!r}; models with remat: "
            f"{', '.join(with_remat)}. Set remat=false."
        )
