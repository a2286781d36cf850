"""The one autotune cache: a versioned JSON file of measured choices and their evidence.

``{"format": "layoutlab.autotune/2", "entries": {key: entry}}``; every entry has a
``"kind"`` (``"layout"``: a layout x precision choice, ``"conv"``: one conv shape's
algorithm), its ``"choice"`` and the evidence it was made on: the candidates' times and
numerics, backend, device kind, jax/jaxlib versions, objective (or mode) and compiler
options. Path: ``$LAYOUTLAB_AUTOTUNE_CACHE`` or ``~/.cache/layoutlab/autotune.json``.
Writes go through a temporary file and a rename, so a reader never sees half a file.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path

import jax

__all__ = [
    "CACHE_ENV",
    "CACHE_FORMAT",
    "AutotuneCache",
    "default_cache_path",
    "device_for",
    "versions",
]

CACHE_FORMAT = "layoutlab.autotune/2"
CACHE_ENV = "LAYOUTLAB_AUTOTUNE_CACHE"
CACHE_FILE = "autotune.json"
KINDS = ("layout", "conv")


def default_cache_path() -> Path:
    """``$LAYOUTLAB_AUTOTUNE_CACHE`` (a file, or a directory to hold ``autotune.json``)
    or ``$XDG_CACHE_HOME/layoutlab/autotune.json`` (``~/.cache`` by default)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        path = Path(env).expanduser()
        return path / CACHE_FILE if path.is_dir() else path
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "layoutlab" / CACHE_FILE


def versions() -> dict[str, str | None]:
    """The jax and jaxlib versions choices are keyed by (package metadata)."""
    out = {}
    for name in ("jax", "jaxlib"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def device_for(backend: str | None):
    """This process's first device of ``backend`` (None: JAX's default), or a ``ValueError``.
    Local, since a tuning fetches what it runs: in a multi-process run ``jax.devices()[0]``
    may belong to another process."""
    try:
        return jax.local_devices(backend=backend)[0]
    except RuntimeError as err:
        raise ValueError(f"No {backend!r} device: {err}") from None


class AutotuneCache:
    """The cache file at ``path`` (None: ``default_cache_path()``), read once on creation;
    ``put`` changes the copy in memory and ``save`` writes it back."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path).expanduser() if path is not None else default_cache_path()
        self.entries: dict[str, dict] = {}
        if self.path.is_file():
            try:
                data = json.loads(self.path.read_text())
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{self.path} is not valid JSON ({err}); delete it or pass another cache "
                    "path (--cache)."
                ) from None
            if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
                raise ValueError(
                    f"{self.path} is not an autotune cache (format {CACHE_FORMAT}); delete it "
                    "(older layoutlab caches are not read) or pass another cache path (--cache)."
                )
            self.entries = dict(data.get("entries", {}))

    @classmethod
    def at(cls, cache: AutotuneCache | str | Path | None) -> AutotuneCache:
        return cache if isinstance(cache, AutotuneCache) else cls(cache)

    def get(self, key: str, kind: str) -> dict | None:
        entry = self.entries.get(key)
        return entry if entry is not None and entry.get("kind") == kind else None

    def put(self, key: str, kind: str, entry: dict) -> None:
        if kind not in KINDS:
            raise ValueError(f"autotune cache kind must be one of {KINDS}, got {kind!r}.")
        self.entries[key] = {**entry, "kind": kind}

    def save(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        payload = {"format": CACHE_FORMAT, "entries": self.entries}
        tmp.write_text(json.dumps(payload, indent=1) + "\n")
        os.replace(tmp, self.path)
        return self.path
