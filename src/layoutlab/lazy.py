"""Lazy package exports: ``import layoutlab.bench`` (and ``bench.tuning``, which the CLI
imports to build its parser) stays light; a name's module is imported on first use. Old
names of renamed exports resolve too, each with a ``DeprecationWarning`` naming the new one."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str,
    exports: Mapping[str, str],
    names: Callable[[], set[str]],
    renamed: Mapping[str, str] | None = None,
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose ``exports`` maps a public name to
    the submodule (relative to ``package``) that defines it; ``names()`` gives the package's
    own globals. ``renamed`` maps an old name to the dotted path of what it is called now
    (``"layoutlab.data.SOURCE_FORMS"``): the old name still gives it, with a
    ``DeprecationWarning``, and is not listed by ``dir()``."""
    renamed = renamed or {}

    def getattr_(name: str):
        if name in exports:
            return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        if name in renamed:
            module, _, new = renamed[name].rpartition(".")
            warnings.warn(
                f"{package}.{name} is deprecated; use {renamed[name]}.",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(importlib.import_module(module), new)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def dir_() -> list[str]:
        return sorted(names() | set(exports))

    return getattr_, dir_
