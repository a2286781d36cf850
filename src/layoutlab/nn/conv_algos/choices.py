"""The process-wide table ``"auto"`` reads: conv spec key -> algorithm name, per platform.

``layoutlab.bench.conv_autotune`` measures and fills it (or loads it from its JSON cache);
this module only stores and reads choices, so ``nn`` never imports ``bench``.
A forced algorithm (``force_conv_algorithm``) overrides every conv traced inside the
``with`` block, choices and per-layer settings alike. JAX caches traces, so it only affects
functions traced (first called, or re-jitted) inside the block.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import jax

from layoutlab.nn.conv_algos.registry import AUTO, XLA, check_name

CACHE_FORMAT = "layoutlab.conv_autotune/1"
CACHE_ENV = "LAYOUTLAB_CONV_AUTOTUNE_CACHE"
_TABLE: dict[tuple[str, str], str] = {}
_FORCED = threading.local()


def _platform(platform: str | None) -> str:
    return platform or jax.default_backend()


def set_choice(key: str, algorithm: str, *, platform: str | None = None) -> None:
    """Remember that the conv with spec ``key`` runs fastest with ``algorithm``."""
    if check_name(algorithm) == AUTO:
        raise ValueError("a choice must name an algorithm, not 'auto'.")
    _TABLE[(_platform(platform), key)] = algorithm


def get_choice(key: str, *, platform: str | None = None) -> str | None:
    return _TABLE.get((_platform(platform), key))


def choices(platform: str | None = None) -> dict[str, str]:
    """The current table for ``platform`` (default backend when None)."""
    plat = _platform(platform)
    return {k: v for (p, k), v in _TABLE.items() if p == plat}


def clear_choices() -> None:
    _TABLE.clear()


def update_choices(table: Mapping[str, str], *, platform: str | None = None) -> None:
    for key, name in table.items():
        set_choice(key, name, platform=platform)


def default_cache_path() -> Path:
    """``$LAYOUTLAB_CONV_AUTOTUNE_CACHE`` or ``~/.cache/layoutlab/conv_autotune.json``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "layoutlab" / "conv_autotune.json"


def versions() -> dict[str, str | None]:
    """The jax and jaxlib versions choices are keyed by (package metadata)."""
    out = {}
    for name in ("jax", "jaxlib"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def _matching_entries(data: dict, objective: str, compiler_options: dict | None) -> dict:
    """``{spec_key: choice}`` of autotune cache entries made on this device and versions."""
    device = jax.devices()[0]
    options = dict(sorted((compiler_options or {}).items()))
    here = versions()
    out = {}
    for entry in data.get("entries", {}).values():
        if (
            entry.get("backend") == device.platform
            and entry.get("device_kind") == device.device_kind
            and entry.get("versions") == here
            and entry.get("objective") == objective
            and entry.get("compiler_options", {}) == options
        ):
            out[entry["spec_key"]] = entry["choice"]
    return out


def load_choices(
    path: str | Path | None = None,
    *,
    objective: str = "train",
    compiler_options: dict | None = None,
    platform: str | None = None,
) -> dict[str, str]:
    """Load choices into the table from ``path`` (default ``default_cache_path()``);
    returns ``{spec_key: algorithm}`` loaded.

    ``path`` is either a plain table, ``{"choices": {spec_key: algorithm}}``, or the JSON
    cache ``layoutlab.bench.conv_autotune`` writes (``CACHE_FORMAT``), of which only the
    entries measured on this device kind with these jax/jaxlib versions, ``objective``
    and ``compiler_options`` are used. Entries naming an algorithm this process does not
    know are skipped, so a file written with extra (e.g. test-only) algorithms still loads.
    """
    path = Path(path).expanduser() if path is not None else default_cache_path()
    if not path.is_file():
        raise FileNotFoundError(
            f"No conv algorithm choices at {path}; run layoutlab.bench.conv_autotune "
            "(autotune_model/autotune_convs) first, or pass the path of an existing file."
        )
    data = json.loads(path.read_text())
    if isinstance(data, dict) and data.get("format") == CACHE_FORMAT:
        table = _matching_entries(data, objective, compiler_options)
    else:
        table = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(table, dict):
        raise ValueError(
            f"{path} is neither a conv choices table (a 'choices' mapping) nor a conv "
            f"autotune cache (format {CACHE_FORMAT})."
        )
    loaded = {}
    for key, name in table.items():
        try:
            set_choice(key, name, platform=platform)
        except ValueError:
            continue
        loaded[key] = name
    return loaded


def forced_algorithm() -> str | None:
    return getattr(_FORCED, "name", None)


@contextlib.contextmanager
def force_conv_algorithm(name: str | None) -> Iterator[None]:
    """Run every conv traced inside with ``name`` (``None``: no override)."""
    if name is not None:
        check_name(name)
    previous = forced_algorithm()
    _FORCED.name = name
    try:
        yield
    finally:
        _FORCED.name = previous


def resolve_auto(key: str) -> str:
    """The table's choice for ``key``, else native XLA."""
    return get_choice(key) or XLA
