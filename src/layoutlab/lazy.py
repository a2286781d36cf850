"""Lazy package exports: ``import layoutlab.bench`` (and ``bench.tuning``, which the CLI
imports to build its parser) stays light; a name's module is imported on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str], names: Callable[[], set[str]]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose ``exports`` maps a public name to
    the submodule (relative to ``package``) that defines it; ``names()`` gives the package's
    own globals."""

    def getattr_(name: str):
        if name in exports:
            return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def dir_() -> list[str]:
        return sorted(names() | set(exports))

    return getattr_, dir_
