"""Keep freed host memory in the process, so XLA:CPU stops page-faulting its temp buffer.

XLA:CPU allocates an executable's temp buffer (1.4 GB for a ResNet-18 CIFAR training step at
batch 128) on every call, from its own worker threads. glibc serves an allocation that large
from a fresh ``mmap`` and returns it with ``munmap`` when it is freed, so each call
page-faults the whole buffer again and the kernel zeroes every page: about 370,000 minor
faults and 0.8 s of system time per step on a 2-core machine. ``keep_host_memory()`` sets
three glibc ``mallopt`` parameters so that freed memory stays in the heap and later calls
reuse it (the first few calls still grow the heap to its peak):

- ``M_ARENA_MAX=1``: one arena for every thread. A worker thread's own arena cannot hold a
  1.4 GB block and glibc then maps it fresh whatever ``M_MMAP_MAX`` says.
- ``M_MMAP_MAX=0``: large blocks come from the heap, not from ``mmap``.
- ``M_TRIM_THRESHOLD=-1``: the heap is never shrunk, so the pages stay mapped.

The price is that the process keeps its peak heap until it exits, which is what a training or
benchmark process wants. The settings are process-wide: PyTorch running in the same process
gets them too (its large tensors are mapped fresh the same way).

Threads keep the arena they first allocated from, so the call must come before JAX starts
its backend; afterwards it raises ``HostMemoryError``. The same settings can be given before
Python starts, through the environment (``GLIBC_TUNABLES``, see ``ENV_SETTING``).
"""

from __future__ import annotations

import ctypes
import os
import platform
from typing import NamedTuple

__all__ = [
    "ENV_SETTING",
    "HostMemoryError",
    "HostMemoryState",
    "host_memory_state",
    "keep_host_memory",
]

# glibc's mallopt parameter numbers (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
# (parameter, value); a trim threshold of -1 turns trimming off.
_SETTINGS = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1))
# The same settings for a process's environment, read by glibc when the process starts.
ENV_SETTING = (
    "GLIBC_TUNABLES=glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:"
    "glibc.malloc.trim_threshold=68719476736"
)
_TUNABLES = ("glibc.malloc.arena_max=1", "glibc.malloc.mmap_max=0", "glibc.malloc.trim_threshold")

_applied = False


class HostMemoryError(RuntimeError):
    """``keep_host_memory()`` was called too late, or glibc refused a setting."""


class HostMemoryState(NamedTuple):
    kept: bool  # freed host memory stays in the process
    how: str  # "mallopt", "environment", or why it is not kept


def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def _from_environment() -> bool:
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return all(t in tunables for t in _TUNABLES)


def _backend_started() -> bool:
    try:
        from jax._src import xla_bridge
    except ImportError:  # no jax: nothing has started
        return False
    started = getattr(xla_bridge, "backends_are_initialized", None)
    return bool(started()) if started is not None else False


def host_memory_state() -> HostMemoryState:
    """Whether freed host memory stays in this process, and how it was arranged."""
    if _applied:
        return HostMemoryState(True, "mallopt")
    if _from_environment():
        return HostMemoryState(True, "environment")
    if _glibc() is None:
        return HostMemoryState(False, "not glibc: the setting applies to Linux with glibc only")
    return HostMemoryState(False, "default glibc malloc")


def keep_host_memory() -> HostMemoryState:
    """Keep freed host memory in the process (see the module docstring). Call it before the
    first JAX computation. Returns the resulting state; on a platform without glibc it
    changes nothing and says so in ``how``."""
    global _applied
    state = host_memory_state()
    libc = _glibc()
    if state.kept or libc is None:
        return state
    if _backend_started():
        raise HostMemoryError(
            "keep_host_memory() must run before JAX starts its backend: the worker threads "
            "already chose their malloc arenas. Call it first thing (before any jax "
            f"computation or jax.devices()), or start Python with {ENV_SETTING}."
        )
    for param, value in _SETTINGS:
        if libc.mallopt(ctypes.c_int(param), ctypes.c_int(value)) != 1:
            raise HostMemoryError(f"glibc refused mallopt({param}, {value}).")
    _applied = True
    return host_memory_state()
