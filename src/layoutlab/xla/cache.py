"""Persistent compilation cache on/off, and telling whether a compile was served from it.

``enable_compilation_cache(path)`` sets jax's config options:

- ``jax_compilation_cache_dir``: where executables are stored;
- ``jax_persistent_cache_min_compile_time_secs`` (default here 0): store every compile, not
  only those slower than jax's 1 s default;
- ``jax_persistent_cache_min_entry_size_bytes`` (default here -1): no size threshold, and jax
  may not raise it on its own (0 lets jax pick a filesystem-specific minimum);

then resets jax's cache object so a new directory takes effect in a running process.

Hits are detected with ``jax.monitoring`` events that jax records per compile:
``/jax/compilation_cache/cache_hits`` and ``/jax/compilation_cache/cache_misses`` for the
persistent cache, and the ``/jax/core/compile/backend_compile_duration`` duration event for
any trip to the backend. No backend trip means jax served the executable from its in-memory
cache (same function, shapes and options compiled before in this process).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator

import jax

__all__ = [
    "CacheEvents",
    "compilation_cache",
    "compilation_cache_dir",
    "disable_compilation_cache",
    "enable_compilation_cache",
    "watch_compilation",
]

_HIT = "/jax/compilation_cache/cache_hits"
_MISS = "/jax/compilation_cache/cache_misses"
_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_OPTIONS = (
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes",
)


def _reset_jax_cache() -> None:
    # The cache object is built once per process from the config; reset it so a new
    # directory (or none) is picked up on the next compile.
    try:
        from jax.experimental.compilation_cache import compilation_cache as cc
    except ImportError:  # pragma: no cover - depends on the jax version
        return
    if hasattr(cc, "reset_cache"):
        cc.reset_cache()


def compilation_cache_dir() -> str | None:
    """The persistent cache directory in force, or None when the cache is off."""
    return jax.config.jax_compilation_cache_dir or None


def enable_compilation_cache(
    path: str | os.PathLike,
    *,
    min_compile_time_secs: float = 0.0,
    min_entry_size_bytes: int = -1,
) -> dict:
    """Store compiled executables under ``path``; returns the previous settings."""
    path = os.fspath(path)
    if not path:
        raise ValueError("enable_compilation_cache needs a directory path, got an empty string")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"compilation cache path {path!r} exists and is not a directory")
    os.makedirs(path, exist_ok=True)
    previous = {name: getattr(jax.config, name) for name in _OPTIONS}
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_secs))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", int(min_entry_size_bytes))
    _reset_jax_cache()
    return previous


def disable_compilation_cache() -> dict:
    """Stop using a persistent cache; returns the previous settings."""
    previous = {name: getattr(jax.config, name) for name in _OPTIONS}
    jax.config.update("jax_compilation_cache_dir", None)
    _reset_jax_cache()
    return previous


def _restore(settings: dict) -> None:
    for name, value in settings.items():
        jax.config.update(name, value)
    _reset_jax_cache()


@contextlib.contextmanager
def compilation_cache(path: str | os.PathLike, **kwargs) -> Iterator[str]:
    """Use a persistent cache at ``path`` inside the block, then restore the old settings."""
    previous = enable_compilation_cache(path, **kwargs)
    try:
        yield os.fspath(path)
    finally:
        _restore(previous)


@dataclasses.dataclass
class CacheEvents:
    """What jax reported while a compile ran (None: ``jax.monitoring`` was unavailable)."""

    hits: int | None = None
    misses: int | None = None
    # Trips to the backend: a compile, or a read from the persistent cache (jax times both
    # as one event), so hits are counted here too.
    backend_compiles: int | None = None

    @property
    def cache_hit(self) -> bool | None:
        """True: served from the persistent cache; False: looked up and missed; None: not
        looked up (cache off, or the executable came from jax's in-memory cache)."""
        if self.hits is None:
            return None
        if self.hits:
            return True
        return False if self.misses else None

    @property
    def in_memory_hit(self) -> bool | None:
        """True when jax reused an executable from this process without calling XLA."""
        return None if self.backend_compiles is None else self.backend_compiles == 0


@contextlib.contextmanager
def watch_compilation() -> Iterator[CacheEvents]:
    """Count cache hits/misses and backend compiles recorded inside the block."""
    mon = jax.monitoring
    needed = (
        "register_event_listener",
        "unregister_event_listener",
        "register_event_duration_secs_listener",
        "unregister_event_duration_listener",
    )
    events = CacheEvents()
    if not all(hasattr(mon, n) for n in needed):
        yield events
        return
    events.hits = events.misses = events.backend_compiles = 0

    def on_event(name: str, **_kw) -> None:
        if name == _HIT:
            events.hits += 1
        elif name == _MISS:
            events.misses += 1

    def on_duration(name: str, _secs: float, **_kw) -> None:
        if name == _BACKEND_COMPILE:
            events.backend_compiles += 1

    mon.register_event_listener(on_event)
    mon.register_event_duration_secs_listener(on_duration)
    try:
        yield events
    finally:
        mon.unregister_event_listener(on_event)
        mon.unregister_event_duration_listener(on_duration)
