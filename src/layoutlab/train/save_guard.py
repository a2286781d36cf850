"""Holds back what orbax prints while a save fails, so the save's error reads as one line.

When a write fails (a full disk, say), orbax's worker threads log the error with a traceback
through absl, and tensorstore's callbacks then find their asyncio loop closed and raise
"Event loop is closed" as unraisable exceptions. The save's own exception carries the cause,
so for a failed save these are noise; for a save that succeeds they are passed on unchanged.
"""

from __future__ import annotations

import contextlib
import logging
import sys

__all__ = ["quiet_failed_save"]

_LOGGERS = ("absl", "orbax")


class _Held(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _closed_loop(unraisable) -> bool:
    exc = unraisable.exc_value
    return isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"


class _DropClosedLoop:
    """An unraisable hook passing everything but "Event loop is closed" on to ``inner``."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, unraisable) -> None:
        if not _closed_loop(unraisable):
            self.inner(unraisable)


@contextlib.contextmanager
def quiet_failed_save():
    """Around one orbax save: log records and unraisable exceptions are held and, if the
    save raises, dropped. A failed save's tensorstore callbacks can still fire after it
    returns, so after a failure the "Event loop is closed" ones stay filtered for the rest
    of the process (they never mean anything else); every other unraisable still shows."""
    held = _Held()
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    saved = [(lg.propagate, lg.handlers[:]) for lg in loggers]
    for lg in loggers:
        lg.propagate, lg.handlers = False, [held]
    unraisables = []
    previous_hook = sys.unraisablehook
    sys.unraisablehook = unraisables.append
    failed = True
    try:
        yield
        failed = False
    finally:
        for lg, (propagate, handlers) in zip(loggers, saved, strict=True):
            lg.propagate, lg.handlers = propagate, handlers
        if failed:
            keep = previous_hook
            if not isinstance(keep, _DropClosedLoop):
                keep = _DropClosedLoop(previous_hook)
            sys.unraisablehook = keep
            unraisables = [u for u in unraisables if not _closed_loop(u)]
        else:
            sys.unraisablehook = previous_hook
            for record in held.records:
                logging.getLogger(record.name).handle(record)
        for unraisable in unraisables:
            previous_hook(unraisable)
