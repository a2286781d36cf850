"""Refusing a data set that cannot fit in memory, before any of it is allocated.

A data set lives in host memory as float32 NHWC arrays (``data.dataset``), and is built
through one more copy of that size (the seed split, or the normalization of the decoded
pixels). So a data set of N images of HxWxC needs about ``2 * 4 * N*H*W*C`` bytes at its
peak. A larger one than the machine has available (``MemAvailable`` in ``/proc/meminfo``:
what can be allocated without swapping) would otherwise swap or be killed minutes later;
it is refused up front, with both figures.
"""

from __future__ import annotations

import math
from pathlib import Path

from layoutlab.data.errors import DataError

__all__ = ["available_bytes", "check_fits", "peak_bytes"]

_MEMINFO = Path("/proc/meminfo")
# The float32 arrays, and the one copy of them made while they are built.
_COPIES = 2
_FLOAT32_BYTES = 4


def available_bytes() -> int | None:
    """The memory the machine can allocate now without swapping (``MemAvailable``), or None
    where the kernel does not say (not Linux)."""
    try:
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def peak_bytes(count: int, shape: tuple[int, ...]) -> int:
    """The peak host memory of a data set of ``count`` images of ``shape`` (HxWxC)."""
    return _COPIES * _FLOAT32_BYTES * count * math.prod(shape)


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB"


def check_fits(name: str, what: str, need: int, fix: str) -> None:
    """Raises ``DataError`` when ``need`` bytes (of ``what``: "N images of HxWxC") are
    more memory than is available; ``fix`` says what makes the data set smaller."""
    have = available_bytes()
    if have is None or need <= have:
        return
    raise DataError(
        f"{name}: {what} need about {_gb(need)} of memory (float32, and a copy while they "
        f"are built), but the machine has {_gb(have)} available (MemAvailable); {fix}."
    )
