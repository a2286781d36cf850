"""Which XLA backends this process has, and picking one by name with a readable error."""

from __future__ import annotations

from typing import NamedTuple

import jax

__all__ = ["Backend", "BackendError", "available_backends", "resolve_backend"]

# Names a user may type for the same platform.
_ALIASES = {"cuda": "gpu", "rocm": "gpu", "host": "cpu"}


class BackendError(ValueError):
    """The requested backend is unknown or has no devices in this process."""


class Backend(NamedTuple):
    name: str  # the name jax knows it by, e.g. "cpu", "cuda"
    platform: str  # the device platform, e.g. "cpu", "gpu"
    device: jax.Device  # the device compiles are placed on
    device_kind: str
    platform_version: str | None


def _clients() -> dict:
    # jax.extend.backend.backends() initializes and returns every platform jax can start.
    try:
        from jax.extend import backend as jex_backend

        return dict(jex_backend.backends())
    except (ImportError, AttributeError):  # fall back to the default backend only
        dev = jax.devices()[0]
        return {jax.default_backend(): dev.client}


def available_backends() -> list[str]:
    """Names accepted by ``resolve_backend``, e.g. ``["cpu"]`` or ``["cpu", "cuda", "gpu"]``."""
    names = set()
    for name, client in _clients().items():
        names.add(name)
        names.add(client.platform)
    return sorted(names)


def resolve_backend(name: str | None = None) -> Backend:
    """The backend called ``name`` (default: jax's default backend) and its first device."""
    if name is not None and not isinstance(name, str):
        raise BackendError(f"backend must be a string such as 'cpu' or 'gpu', got {name!r}")
    clients = _clients()
    wanted = (name or jax.default_backend()).strip().lower()
    wanted = _ALIASES.get(wanted, wanted) if wanted not in clients else wanted
    for key, client in clients.items():
        if wanted in (key, client.platform):
            devices = client.local_devices()
            if devices:
                dev = devices[0]
                version = getattr(client, "platform_version", None)
                return Backend(key, dev.platform, dev, dev.device_kind, version)
    available = ", ".join(available_backends()) or "none"
    hint = ""
    if wanted == "gpu":
        hint = (
            " No GPU is visible to jax; install jax's CUDA build (pip install "
            "'layoutlab[gpu]') or run on a GPU machine."
        )
    raise BackendError(f"Backend {name!r} is not available.{hint} Available backends: {available}.")
