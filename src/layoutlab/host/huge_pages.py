"""Transparent huge pages for the heaps that keep XLA:CPU's buffers.

With ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` glibc's malloc asks the kernel for transparent huge
pages (``madvise(MADV_HUGEPAGE)``) on the memory it maps for its heaps. A kernel whose THP mode is
``madvise`` (``/sys/kernel/mm/transparent_hugepage/enabled``, a common default) gives them only when
asked. With host memory kept (``host.memory``), this made heavy steps faster and the small
digits job slower (docs/performance/measurements.md#huge-pages), hence the commands' size threshold
(``host.flag.HUGE_PAGES_MIN_PIXELS``).

glibc reads the tunable only when a process starts, so nothing can turn it on in a running
process. Instead, the ``layoutlab`` command starts itself again with it
(``restart_with_huge_pages``) before anything else runs, where it keeps host memory
(``host.flag.huge_pages_wanted``) and the tunable would change something
(``huge_pages_environ``). A script or notebook kernel gets the same by being started with
it: ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python train.py``. A ``GLIBC_TUNABLES`` that
already names ``glibc.malloc.hugetlb`` is the user's choice, and is kept as it is; ``=0``
turns huge pages off for the command.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "THP_MODE_FILE",
    "TUNABLE",
    "HugePagesState",
    "huge_pages_environ",
    "huge_pages_state",
    "restart_with_huge_pages",
    "thp_mode",
]

TUNABLE = "glibc.malloc.hugetlb=1"
_NAME = TUNABLE.split("=")[0] + "="
THP_MODE_FILE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
# The first glibc with the tunable.
_MIN_GLIBC = (2, 35)


class HugePagesState(NamedTuple):
    on: bool  # this process's malloc asks for transparent huge pages
    how: str  # the setting, or why it is off


def _glibc_version() -> tuple[int, ...] | None:
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()  # "glibc 2.36"
    except (AttributeError, ValueError, OSError):  # not glibc, or not Linux
        return None
    try:
        return tuple(int(p) for p in version.split(".")[:2]) if name == "glibc" else None
    except ValueError:
        return None


def thp_mode(path: Path | None = None) -> str | None:
    """The kernel's transparent-huge-page mode (``always``, ``madvise``, ``never``) as
    ``path`` (default: ``THP_MODE_FILE``) gives it, or None where the kernel does not say."""
    try:
        words = Path(path or THP_MODE_FILE).read_text().split()
    except OSError:
        return None
    chosen = [w[1:-1] for w in words if w.startswith("[") and w.endswith("]")]
    return chosen[0] if chosen else None


def _hugetlb_item(tunables: str) -> str | None:
    """The ``glibc.malloc.hugetlb`` value ``tunables`` (a ``GLIBC_TUNABLES`` value) sets, or
    None; the last one wins, as in glibc."""
    values = [i[len(_NAME) :] for i in tunables.split(":") if i.startswith(_NAME)]
    return values[-1] if values else None


def _why_not(tunables: str) -> str | None:
    """Why adding the tunable to a process with ``tunables`` would change nothing, or None."""
    if _hugetlb_item(tunables) is not None:
        return f"GLIBC_TUNABLES sets {_NAME}{_hugetlb_item(tunables)} already"
    version = _glibc_version()
    if version is None:
        return "not glibc: the setting applies to Linux with glibc only"
    if version < _MIN_GLIBC:
        return f"glibc {'.'.join(map(str, version))} predates the tunable (2.35)"
    mode = thp_mode()
    if mode != "madvise":
        return f"the kernel's transparent huge pages are {mode or 'unknown'}, not madvise"
    return None


def huge_pages_environ(environ: dict | None = None) -> dict | None:
    """A copy of ``environ`` (default: ``os.environ``) with ``TUNABLE`` added to its
    ``GLIBC_TUNABLES``, where a process started with it would get huge pages it would not
    get otherwise: Linux with glibc 2.35 or later, the kernel's THP mode ``madvise``, and no
    ``glibc.malloc.hugetlb`` in ``GLIBC_TUNABLES`` already. Else None."""
    env = dict(os.environ if environ is None else environ)
    tunables = env.get("GLIBC_TUNABLES", "")
    if _why_not(tunables) is not None:
        return None
    env["GLIBC_TUNABLES"] = f"{tunables}:{TUNABLE}" if tunables else TUNABLE
    return env


def _start_tunables() -> str:
    """``GLIBC_TUNABLES`` as this process was started with it (what glibc read), which a
    later change of ``os.environ`` does not alter."""
    try:
        items = Path("/proc/self/environ").read_bytes().split(b"\0")
    except OSError:
        return os.environ.get("GLIBC_TUNABLES", "")
    for item in items:
        if item.startswith(b"GLIBC_TUNABLES="):
            return item.split(b"=", 1)[1].decode(errors="replace")
    return ""


def huge_pages_state() -> HugePagesState:
    """Whether this process's malloc asks for transparent huge pages, and why (not)."""
    tunables = _start_tunables()
    value = _hugetlb_item(tunables)
    if value == "1":
        version = _glibc_version()
        mode = thp_mode()
        on = version is not None and version >= _MIN_GLIBC and mode in ("madvise", "always")
        return HugePagesState(on, f"GLIBC_TUNABLES {_NAME}{value} at start, THP {mode}")
    if value == "2":  # hugetlbfs pages, where the system has reserved them
        return HugePagesState(True, f"GLIBC_TUNABLES {_NAME}2 at start (hugetlbfs pages)")
    return HugePagesState(False, _why_not(tunables) or "glibc's default (no huge pages asked)")


def restart_with_huge_pages() -> None:
    """Replace this process with itself started again (``sys.orig_argv``) with
    ``huge_pages_environ()``, where that gives huge pages; else return. Call it before
    anything starts threads or writes output: the new process starts from the beginning."""
    env = huge_pages_environ()
    argv = getattr(sys, "orig_argv", None)
    if env is None or not argv:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, argv, env)
    except OSError:  # the process goes on without huge pages
        return
