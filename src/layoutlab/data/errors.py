"""The error raised for data that is missing, corrupt or in the wrong format."""

from __future__ import annotations

__all__ = ["DataError"]


class DataError(ValueError):
    """A data file or directory exists but does not hold what the loader expects."""
