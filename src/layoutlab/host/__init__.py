"""The process's host memory under XLA:CPU: glibc's malloc arenas and transparent huge pages.

- ``keep_host_memory()``: freed host memory stays in the process (XLA:CPU's per-call temp
  buffer stops page-faulting); call before JAX starts, or with per-thread arenas any time;
  ``release_host_memory()`` undoes the per-thread setting; ``host_memory_state()`` says
  what holds
- ``huge_pages_environ()`` / ``huge_pages_state()``: glibc's transparent huge pages, which a
  process gets only when started with them (the ``layoutlab`` command starts itself again
  with them from 8,192 input pixels per batch)
- ``flag``: the commands' ``--keep-host-memory`` and the settings a command line gets

Names load lazily (``layoutlab.lazy``), so the CLI imports the package without JAX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from layoutlab.lazy import lazy_exports

if TYPE_CHECKING:
    from layoutlab.host.huge_pages import HugePagesState, huge_pages_environ, huge_pages_state
    from layoutlab.host.memory import (
        HostMemoryError,
        HostMemoryState,
        host_memory_state,
        keep_host_memory,
        release_host_memory,
    )

_EXPORTS = {
    "HostMemoryError": "memory",
    "HostMemoryState": "memory",
    "host_memory_state": "memory",
    "keep_host_memory": "memory",
    "release_host_memory": "memory",
    "HugePagesState": "huge_pages",
    "huge_pages_environ": "huge_pages",
    "huge_pages_state": "huge_pages",
}

__all__ = [
    "HostMemoryError",
    "HostMemoryState",
    "HugePagesState",
    "host_memory_state",
    "huge_pages_environ",
    "huge_pages_state",
    "keep_host_memory",
    "release_host_memory",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, lambda: set(globals()))
