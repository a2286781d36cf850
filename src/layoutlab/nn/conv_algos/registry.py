"""The table of convolution algorithms, by name.

An algorithm computes a 2D conv on a channels-last input (``NHWC``) with an ``HWIO`` kernel;
``dispatch.conv2d`` moves other layouts in and out. ``supports(spec)`` returns None when
the algorithm handles ``spec`` and otherwise the reason it does not, and the conv then
falls back to XLA's native convolution. ``dtype_reason(dtype)`` is the part of that which
depends only on the compute dtype (an algorithm whose error exceeds a dtype's bar refuses
it), so a config can be refused before anything is traced: ``unsupported_reason``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import NamedTuple

import jax.numpy as jnp

from layoutlab.nn.conv_algos.geometry import ConvSpec, Geometry
from layoutlab.nn.conv_names import AUTO, XLA

__all__ = [
    "Algorithm",
    "Core",
    "DtypeReason",
    "Supports",
    "algorithm_names",
    "any_dtype",
    "check_name",
    "get_algorithm",
    "plain_2d",
    "register_algorithm",
    "unregister_algorithm",
    "unsupported_reason",
]


# core(x_nhwc, w_hwio, geometry, preferred_element_type) -> y_nhwc
Core = Callable[..., object]
Supports = Callable[[ConvSpec], "str | None"]
DtypeReason = Callable[[str], "str | None"]


def any_dtype(dtype: str) -> str | None:
    return None


class Algorithm(NamedTuple):
    """``supports`` must refuse every spec whose dtype ``dtype_reason`` refuses.

    ``custom_calls``: the core calls kernels outside XLA (custom calls, e.g. oneDNN's), so a
    program with it runs only where layoutlab registered them; ``layoutlab export`` runs XLA's
    conv in its place (``conv_config.without_custom_calls``).
    """

    name: str
    core: Core
    supports: Supports
    description: str
    dtype_reason: DtypeReason = any_dtype
    custom_calls: bool = False


_REGISTRY: dict[str, Algorithm] = {}
_builtins_loaded: list[bool] = []


def _registry() -> dict[str, Algorithm]:
    # The built-in algorithms register on import of ``builtin``, on the first lookup, so
    # importing the package (as the CLI does to build its parser) stays light.
    if not _builtins_loaded:
        _builtins_loaded.append(True)
        importlib.import_module("layoutlab.nn.conv_algos.builtin")
    return _REGISTRY


def register_algorithm(algorithm: Algorithm, *, replace: bool = False) -> Algorithm:
    """Add ``algorithm`` to the table (``replace=True`` to overwrite a name)."""
    if algorithm.name in (AUTO,):
        raise ValueError(f"{algorithm.name!r} is reserved; pick another algorithm name.")
    if algorithm.name in _registry() and not replace:
        raise ValueError(
            f"conv algorithm {algorithm.name!r} is already registered; pass replace=True."
        )
    _REGISTRY[algorithm.name] = algorithm
    return algorithm


def unregister_algorithm(name: str) -> None:
    if name == XLA:
        raise ValueError("the native 'xla' algorithm cannot be removed.")
    _registry().pop(name, None)


def algorithm_names() -> tuple[str, ...]:
    return tuple(_registry())


def get_algorithm(name: str) -> Algorithm:
    if name not in _registry():
        raise ValueError(
            f"Unknown conv algorithm {name!r}; choose one of: {', '.join((AUTO, *_REGISTRY))}."
        )
    return _REGISTRY[name]


def unsupported_reason(name: str, dtype) -> str | None:
    """Why algorithm ``name`` refuses compute ``dtype`` (``"bfloat16"``, ``jnp.float16``, ...)
    for every shape, or None; ``"auto"`` refuses nothing (it never picks a refusing one).

    For config validation: an explicit ``winograd4`` with bfloat16 compute would otherwise
    fall back to XLA at trace time (``select_algorithm`` says why). Unknown names raise the
    ``ValueError`` of ``get_algorithm``.
    """
    if check_name(name) == AUTO:
        return None
    return get_algorithm(name).dtype_reason(jnp.dtype(dtype).name)


def check_name(name: str) -> str:
    """``name`` if it is ``"auto"`` or registered, else a ``ValueError`` listing the names."""
    if name != AUTO:
        get_algorithm(name)
    return name


def plain_2d(spec: ConvSpec) -> str | None:
    """The restriction every custom algorithm shares: ungrouped and undilated."""
    g: Geometry = spec.geometry
    if g.groups != 1:
        return f"groups={g.groups} (grouped and depthwise convs run natively)"
    if g.dilation != (1, 1):
        return f"dilation={g.dilation} (dilated convs run natively)"
    return None
