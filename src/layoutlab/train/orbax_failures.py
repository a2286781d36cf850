"""Keeps a failed orbax call's error to one line.

When orbax fails half way (a full disk while saving, a damaged step while reading), its
worker threads log the error with a traceback through absl, tensorstore's callbacks find
their asyncio loop closed ("Event loop is closed", as unraisable exceptions), abandoned read
coroutines warn that they were never awaited or, when collected, re-raise the read error,
and asyncio logs futures whose exception nobody retrieved. Some of this happens after the
call has returned. The call's own exception carries the cause, so after a failure this echo
is dropped; for a call that succeeds, what was held back is passed on unchanged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings

__all__ = ["quiet_orbax_failure"]

_HELD_LOGGERS = ("absl", "orbax")
_NEVER_AWAITED = "coroutine '.*' was never awaited"


class _Held(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _echo(unraisable) -> bool:
    """Whether an unraisable exception is the echo of a failed orbax call."""
    exc, text = unraisable.exc_value, str(unraisable.exc_value)
    if isinstance(exc, RuntimeError) and text == "Event loop is closed":
        return True
    if isinstance(exc, RuntimeWarning) and "was never awaited" in text:
        return True
    # An abandoned orbax read coroutine, closed when collected, re-raises the read error.
    code = getattr(unraisable.object, "cr_code", None)
    return code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename


class _DropEcho:
    """An unraisable hook passing everything but a failed call's echo on to ``inner``."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, unraisable) -> None:
        if not _echo(unraisable):
            self.inner(unraisable)


class _DropUnretrieved(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Future exception was never retrieved")


def _after_failure() -> None:
    """The echo can come after the call returned, from other threads: filtered from now on
    (only these messages; every other warning, log and unraisable still shows)."""
    if not isinstance(sys.unraisablehook, _DropEcho):
        sys.unraisablehook = _DropEcho(sys.unraisablehook)
    warnings.filterwarnings("ignore", _NEVER_AWAITED, RuntimeWarning)
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, _DropUnretrieved) for f in asyncio_log.filters):
        asyncio_log.addFilter(_DropUnretrieved())


@contextlib.contextmanager
def quiet_orbax_failure():
    """Around one orbax call: its log records and unraisable exceptions are held, and
    dropped if it raises (then see ``_after_failure``)."""
    held = _Held()
    loggers = [logging.getLogger(name) for name in _HELD_LOGGERS]
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
        sys.unraisablehook = previous_hook
        for lg, (propagate, handlers) in zip(loggers, saved, strict=True):
            lg.propagate, lg.handlers = propagate, handlers
        if failed:
            _after_failure()
            unraisables = [u for u in unraisables if not _echo(u)]
        else:
            for record in held.records:
                logging.getLogger(record.name).handle(record)
        for unraisable in unraisables:
            previous_hook(unraisable)
