"""The table of convolution algorithms, by name: where a name (a flag, a config, a plan
file) becomes an ``Algorithm`` value (``algorithm.py``).

The built-in ones (``builtin.BUILTIN``) fill the table on its first lookup, so importing
the package (as the CLI does to build its parser) stays light.
"""

from __future__ import annotations

import jax.numpy as jnp

from layoutlab.nn.conv_algos.algorithm import Algorithm
from layoutlab.nn.conv_names import AUTO, XLA

__all__ = [
    "AUTO",
    "XLA",
    "Algorithm",
    "algorithm_names",
    "algorithm_values",
    "check_name",
    "get_algorithm",
    "register_algorithm",
    "unregister_algorithm",
    "unsupported_reason",
]

_REGISTRY: dict[str, Algorithm] = {}
_builtins_loaded: list[bool] = []


def _registry() -> dict[str, Algorithm]:
    if not _builtins_loaded:
        _builtins_loaded.append(True)
        from layoutlab.nn.conv_algos.builtin import BUILTIN

        for algorithm in BUILTIN:
            _REGISTRY.setdefault(algorithm.name, algorithm)
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


def algorithm_values(names) -> dict[str, Algorithm]:
    """``{name: Algorithm}`` of ``names`` (a plan's ``algorithms().values()``, say): the
    values ``nn.configure(model, plan, algorithms=...)`` takes."""
    return {name: get_algorithm(name) for name in sorted(set(names))}


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
