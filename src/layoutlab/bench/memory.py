"""Peak memory: the device allocator's peak on GPU, the process's peak RSS on the host.

Both are high-water marks over the whole process, not one configuration: read them as an
upper bound for that configuration, and compare configurations by XLA's ``temp_bytes``.
"""

from __future__ import annotations

import resource
import sys

__all__ = ["device_peak_bytes", "peak_rss_bytes"]


def peak_rss_bytes() -> int:
    """The process's peak resident set size so far."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kilobytes, macOS bytes.
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def device_peak_bytes(device) -> int | None:
    """``peak_bytes_in_use`` from the device allocator; None where it keeps no stats (CPU)."""
    try:
        stats = device.memory_stats()
    except Exception:  # CPU clients and some plugins do not implement it
        return None
    if not stats:
        return None
    peak = stats.get("peak_bytes_in_use")
    return int(peak) if peak is not None else None
