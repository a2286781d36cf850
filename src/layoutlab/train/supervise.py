"""``layoutlab train --distributed`` runs the trainer in a child process and turns JAX's
aborts into one line.

JAX's coordination client ends a process at once, with a C++ stack trace and SIGABRT, when
the coordination service fails it: process 0 (which serves it) died, another process
registered with this one's ``--process-id``, the service reported a lost process. Its
callback cannot be replaced from Python, and nothing in the process runs after the abort.
So the command re-runs itself as a child (``SUPERVISED_ENV`` set) with stdout inherited and
stderr passed through this parent, which imports no JAX. From a fatal log line on, stderr is
held back; a child that then dies of SIGABRT becomes one ``error:`` line and exit code 2.
Any other end passes through: the child's exit code, or its signal, which the parent then
dies of too (a kill -9 stays a kill -9). The child dies with the parent (Linux
``PR_SET_PDEATHSIG``), so killing the command kills the trainer.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

__all__ = ["SUPERVISED_ENV", "supervise", "supervised"]

SUPERVISED_ENV = "LAYOUTLAB_SUPERVISED_CHILD"
# glog's fatal line: "F1125 06:46:42.051416   28951 client.h:80] message"
_FATAL = re.compile(rb"(?:^|[\n\r])(F\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\]\n]+\] )")
_PR_SET_PDEATHSIG = 1
_SHOWN_CHARS = 300


def supervised() -> bool:
    """True in the child (or wherever supervision is off)."""
    return bool(os.environ.get(SUPERVISED_ENV))


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the child outlives a killed parent
        pass


def _fatal_message(held: bytes) -> str:
    text = held.decode(errors="replace")
    first = text.split("] ", 1)[-1]
    reason = first.split("absl::Status:", 1)[-1] if "absl::Status:" in first else first
    reason = " ".join(reason.split("*** Check failure stack trace")[0].split())
    return reason if len(reason) <= _SHOWN_CHARS else reason[: _SHOWN_CHARS - 3] + "..."


def _pass_through(stream, out) -> bytes | None:
    """Copies ``stream`` to ``out`` as it comes until a fatal log line; returns what came
    from that line on (None without one). A line that may be the start of a fatal line
    (an "F" with no newline yet) waits for its next bytes."""
    pending, held = b"", None
    while chunk := os.read(stream.fileno(), 65536):
        if held is not None:
            held += chunk
            continue
        pending += chunk
        if match := _FATAL.search(pending):
            start = match.start(1)
            out.write(pending[:start])
            out.flush()
            held, pending = pending[start:], b""
            continue
        cut = max(pending.rfind(b"\n"), pending.rfind(b"\r")) + 1  # a progress bar ends in \r
        tail = pending[cut:]
        keep = tail.startswith(b"F") and len(tail) < 80
        out.write(pending[:cut] if keep else pending)
        out.flush()
        pending = tail if keep else b""
    if pending:
        out.write(pending)
        out.flush()
    return held


def supervise(argv: list[str]) -> int:
    """Runs ``layoutlab <argv>`` as a supervised child; returns its exit code (see above)."""
    child = subprocess.Popen(
        [sys.executable, "-m", "layoutlab.cli", *argv],
        env={**os.environ, SUPERVISED_ENV: "1"},
        stderr=subprocess.PIPE,
        preexec_fn=_die_with_parent,
    )
    # Ctrl-C reaches the child from the terminal; a TERM sent to this process is passed on.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    held = _pass_through(child.stderr, sys.stderr.buffer)
    code = child.wait()
    if held is not None and code == -signal.SIGABRT:
        reason = _fatal_message(held)
        hint = "the first error of the other processes names the cause"
        if "incarnation" in reason:  # the service took a newer registration of this task
            hint = "another process was started with this --process-id: give each its own"
        print(
            "error: JAX's coordination service stopped this process of the distributed run "
            f"({reason}); {hint}.",
            file=sys.stderr,
            flush=True,
        )
        return 2
    if held is not None:
        sys.stderr.buffer.write(held)
        sys.stderr.flush()
    if code < 0:  # die of the child's signal, so the caller sees what happened
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those cannot be handled anyway
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code
