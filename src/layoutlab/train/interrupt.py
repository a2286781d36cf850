"""SIGTERM stops ``layoutlab train`` as Ctrl-C does: where it is, saying how to continue.

Python's default for SIGTERM ends the process at once and silently, while Ctrl-C raises
``KeyboardInterrupt``, which ``layoutlab train`` turns into "interrupted; continue with
--resume". A kill at any instant leaves a usable checkpoint (``train.checkpoint``), so
raising the same exception for SIGTERM is safe wherever it lands, and a job scheduler's stop
(SIGTERM first) reads as what it is. ``train --distributed`` forwards SIGTERM to the child that
trains (``train.supervise``), so it says the same there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

__all__ = ["MESSAGE", "Terminated", "exit_code", "sigterm_interrupts"]

MESSAGE = "interrupted; continue with --resume"
_AGAIN_S = 0.05


class Terminated(KeyboardInterrupt):
    """The run was sent SIGTERM."""


def _raise(signum, frame) -> None:
    # Once: a second SIGTERM ends the process at once, as a stuck wind-down needs.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise Terminated


def _deliver_again(previous):
    """An ``unraisablehook``: the handler's exception raised inside a finalizer or a garbage
    collector callback (JAX runs one) is printed and dropped by Python, and the run would go
    on; the signal is sent again instead, to be raised where the main thread is next."""

    def hook(unraisable) -> None:
        if not isinstance(unraisable.exc_value, Terminated):
            return previous(unraisable)
        signal.signal(signal.SIGTERM, _raise)
        # From another thread, a moment later: sent from here, it would be raised in here.
        threading.Timer(_AGAIN_S, os.kill, (os.getpid(), signal.SIGTERM)).start()

    return hook


@contextlib.contextmanager
def sigterm_interrupts():
    """Within: SIGTERM raises ``Terminated`` (a ``KeyboardInterrupt``); the handler before
    comes back after. Only the main thread may set handlers: elsewhere this changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous, previous_hook = signal.signal(signal.SIGTERM, _raise), sys.unraisablehook
    sys.unraisablehook = hook = _deliver_again(previous_hook)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        # A hook installed over ours meanwhile stays (orbax's failure path filters its late
        # echo from then on, train.orbax_failures); ours passes everything else through.
        if sys.unraisablehook is hook:
            sys.unraisablehook = previous_hook


def exit_code(e: KeyboardInterrupt) -> int:
    """The shell's code for the signal: 128 + its number (130 for Ctrl-C, 143 for SIGTERM)."""
    return 128 + (signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT)
