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

``keep_host_memory(arenas="per_thread")`` sets the last two and ``M_TOP_PAD=128 MiB``. Each
thread keeps its own arena, whose heaps hold blocks up to 64 MiB (glibc's ``HEAP_MAX_SIZE``):
a smaller temp buffer stays mapped without the lock every thread takes on one arena, a
larger one is mapped fresh on every call as with glibc's defaults. The top pad is what keeps
a thread's heap: when a free leaves a secondary heap empty, glibc unmaps it whatever the trim
threshold says, unless the pad (at least a whole heap) asks it to stay. Without the pad a
temp buffer alone in its heap was mapped fresh again on up to half of the calls. The commands
choose per-thread arenas for small batches, where one arena measured slower
(``layoutlab.host.flag``).

The price is that the process keeps its peak heap until it exits, which is what a training or
benchmark process wants. The settings are process-wide: PyTorch running in the same process
gets them too (its large tensors are mapped fresh the same way).

Threads keep the arena they first allocated from, so one arena must come before JAX starts
its backend; afterwards it raises ``HostMemoryError``. Per-thread arenas come and go at any
time: ``release_host_memory()`` sets the three parameters back to what glibc's defaults reach
in a long-running process (``benchmarks/archive/host_memory_switch.py`` compares both in one
process; a bench sweep across batch sizes runs a process per setting instead,
``layoutlab.bench.host_memory_parts``). The same settings can be given before
Python starts, through the environment (``GLIBC_TUNABLES``, see ``ENV_SETTING``).
"""

from __future__ import annotations

import ctypes
import os
import platform
from typing import NamedTuple

__all__ = [
    "ARENAS",
    "ENV_SETTING",
    "ENV_SETTING_PER_THREAD",
    "HostMemoryError",
    "HostMemoryState",
    "backend_started",
    "host_memory_state",
    "keep_host_memory",
    "release_host_memory",
]

# glibc's mallopt parameter numbers (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
# glibc's heap_trim unmaps an empty secondary heap unless the top pad exceeds what the heap
# before it could still take, which is under one HEAP_MAX_SIZE (64 MiB); twice that is
# clear of the boundary. Address space only: pages are touched when used.
_TOP_PAD = 128 << 20
# (parameter, value) by ``arenas``; a trim threshold of -1 turns trimming off.
_HEAP = ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1))
_SETTINGS = {"one": ((_M_ARENA_MAX, 1), *_HEAP), "per_thread": (*_HEAP, (_M_TOP_PAD, _TOP_PAD))}
ARENAS = tuple(_SETTINGS)
# glibc's defaults as a long-running process has them. Setting any parameter turns off the
# dynamic mmap threshold, which starts at 128 KiB and rises to each freed mapped block's size
# up to 32 MiB (DEFAULT_MMAP_THRESHOLD_MAX, 64-bit), the trim threshold following at twice
# that. With the cap, PyTorch's ResNet-18 batch-256 inference step took what it took under
# the true defaults (1.69-1.71 against 1.72 s; benchmarks/archive/host_memory_switch.py). The mmap
# count limit and the top pad are glibc's defaults (DEFAULT_MMAP_MAX, DEFAULT_TOP_PAD).
_RELEASED = (
    (_M_MMAP_MAX, 65536),
    (_M_MMAP_THRESHOLD, 32 << 20),
    (_M_TRIM_THRESHOLD, 64 << 20),
    (_M_TOP_PAD, 128 << 10),
)
# The same settings for a process's environment, read by glibc when the process starts.
ENV_SETTING = (
    "GLIBC_TUNABLES=glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:"
    "glibc.malloc.trim_threshold=68719476736"
)
ENV_SETTING_PER_THREAD = (
    "GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736:"
    f"glibc.malloc.top_pad={_TOP_PAD}"
)
_TUNABLES = ("glibc.malloc.mmap_max=0", "glibc.malloc.trim_threshold")
_ONE_ARENA = "glibc.malloc.arena_max=1"
_TOP_PAD_ITEM = "glibc.malloc.top_pad="
# What ``how`` adds when threads keep their own arenas.
_PER_THREAD = " (per-thread arenas)"

# The ``arenas`` keep_host_memory set, or "released" after release_host_memory.
_applied: str | None = None
_RELEASED_HOW = "mallopt: glibc's default limits (released)"


class HostMemoryError(RuntimeError):
    """``keep_host_memory()`` was called too late, or glibc refused a setting."""


class HostMemoryState(NamedTuple):
    kept: bool  # freed host memory stays in the process
    # "mallopt" or "environment" (one arena), either + " (per-thread arenas)", or why not kept
    how: str


def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def _from_environment() -> str | None:
    """The ``arenas`` that ``GLIBC_TUNABLES`` keeps host memory with, or None."""
    items = os.environ.get("GLIBC_TUNABLES", "").split(":")
    if not all(any(item.startswith(t) for item in items) for t in _TUNABLES):
        return None
    if _ONE_ARENA in items:
        return "one"
    pads = [item[len(_TOP_PAD_ITEM) :] for item in items if item.startswith(_TOP_PAD_ITEM)]
    # Per-thread arenas without the pad still unmap a buffer alone in its heap.
    return "per_thread" if any(p.isdigit() and int(p) >= _TOP_PAD for p in pads) else None


def backend_started() -> bool:
    """Whether this process has started a JAX backend (its threads have chosen arenas)."""
    try:
        from jax._src import xla_bridge
    except ImportError:  # no jax: nothing has started
        return False
    started = getattr(xla_bridge, "backends_are_initialized", None)
    return bool(started()) if started is not None else False


def host_memory_state() -> HostMemoryState:
    """Whether freed host memory stays in this process, and how it was arranged."""
    if _applied == "released":
        return HostMemoryState(False, _RELEASED_HOW)
    for how, arenas in (("mallopt", _applied), ("environment", _from_environment())):
        if arenas is not None:
            return HostMemoryState(True, how + (_PER_THREAD if arenas == "per_thread" else ""))
    if _glibc() is None:
        return HostMemoryState(False, "not glibc: the setting applies to Linux with glibc only")
    return HostMemoryState(False, "default glibc malloc")


def keep_host_memory(arenas: str = "one") -> HostMemoryState:
    """Keep freed host memory in the process (see the module docstring), with ``arenas``
    ``"one"`` (every block kept; call it before the first JAX computation) or
    ``"per_thread"`` (blocks up to 64 MiB kept; any time). Returns the resulting state; on a
    platform without glibc it changes nothing and says so in ``how``; once kept, later calls
    change nothing."""
    global _applied
    if arenas not in _SETTINGS:
        raise ValueError(f"arenas must be one of {ARENAS}, got {arenas!r}.")
    state = host_memory_state()
    libc = _glibc()
    if state.kept or libc is None:
        return state
    # A thread keeps the arena it first allocated from: only one arena for all must come first.
    if arenas == "one" and backend_started():
        raise HostMemoryError(
            "keep_host_memory() must run before JAX starts its backend: the worker threads "
            "already chose their malloc arenas. Call it first thing (before any jax "
            f"computation or jax.devices()), or start Python with {ENV_SETTING}."
        )
    _mallopt(libc, _SETTINGS[arenas])
    _applied = arenas
    return host_memory_state()


def _mallopt(libc: ctypes.CDLL, settings) -> None:
    for param, value in settings:
        if libc.mallopt(ctypes.c_int(param), ctypes.c_int(value)) != 1:
            raise HostMemoryError(f"glibc refused mallopt({param}, {value}).")


def release_host_memory() -> HostMemoryState:
    """Let freed host memory go back to the system again, as with glibc's defaults (see
    ``_RELEASED``), in a process whose threads keep their own arenas: undoes
    ``keep_host_memory("per_thread")`` at any time; a later call of it keeps memory again.
    Raises ``HostMemoryError`` where every thread shares one arena, which a running process
    cannot undo. Without glibc it changes nothing and says so in ``how``."""
    global _applied
    libc = _glibc()
    if libc is None:
        return host_memory_state()
    if _applied == "one" or (_applied is None and _from_environment() == "one"):
        raise HostMemoryError(
            "release_host_memory() cannot undo one malloc arena for every thread in a running "
            "process; start it without keep_host_memory() or GLIBC_TUNABLES."
        )
    _mallopt(libc, _RELEASED)
    _applied = "released"
    return host_memory_state()
