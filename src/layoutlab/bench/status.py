"""Row statuses, and classifying a failed configuration: out of memory or another error."""

from __future__ import annotations

__all__ = ["OK", "OOM", "ERROR", "SKIPPED", "classify_failure", "is_out_of_memory"]

# skipped: not measured because its steps exceed the sweep's max_step_s time limit.
OK, OOM, ERROR, SKIPPED = "ok", "oom", "error", "skipped"

# XLA raises XlaRuntimeError("RESOURCE_EXHAUSTED: Out of memory ..."); PyTorch raises
# torch.OutOfMemoryError ("CUDA out of memory"); the host allocator raises MemoryError.
_OOM_MARKERS = ("resource_exhausted", "out of memory", "outofmemory", "oom when allocating")


def is_out_of_memory(err: BaseException) -> bool:
    if isinstance(err, MemoryError):
        return True
    text = f"{type(err).__name__}: {err}".lower()
    return any(marker in text for marker in _OOM_MARKERS)


def classify_failure(err: BaseException) -> tuple[str, str]:
    """``(status, message)``: ``"oom"`` or ``"error"`` and a one-paragraph message."""
    message = f"{type(err).__name__}: {err}".strip()
    if len(message) > 2000:  # XLA errors can carry whole HLO dumps
        message = message[:2000] + " ..."
    return (OOM if is_out_of_memory(err) else ERROR), message
