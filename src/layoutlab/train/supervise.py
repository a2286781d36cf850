"""``layoutlab train --distributed`` runs the trainer in a child process and turns JAX's
aborts into one line.

JAX's coordination client ends a process at once, with a C++ stack trace and SIGABRT, when
the coordination service fails it: process 0 (which serves it) died, another process
registered with this one's ``--process-id``, the service reported a lost process. Its
callback cannot be replaced from Python, and nothing in the process runs after the abort.
So the command re-runs itself as a child (``SUPERVISED_ENV`` set) with stdout inherited and
stderr passed through this parent, which imports no JAX. From a fatal log line on, from a
log line of JAX's coordination service (it logs only when a process is lost, before the
watchdog's line or the abort), and after the child's own ``error:`` line, stderr is held
back; the child's first ``error:`` line still passes. A child that then dies of SIGABRT
becomes one ``error:`` line and exit code 2 (none more where it printed its own), and a
child that printed its error and exits with code 2 leaves the rest unsaid. Any other end
passes through, with what was held: the child's exit code, or its signal, which the parent
then dies of too (a kill -9 stays a kill -9). The child dies with the parent (Linux
``PR_SET_PDEATHSIG``), so killing the command kills the trainer.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

__all__ = [
    "OutputFilter",
    "SUPERVISED_ENV",
    "fatal_message",
    "finish",
    "pass_through",
    "supervise",
    "supervised",
]

SUPERVISED_ENV = "LAYOUTLAB_SUPERVISED_CHILD"
# glog's log line: "F1125 06:46:42.051416   28951 client.h:80] message" (F: fatal)
_LOG = re.compile(rb"([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ([^\]\n:]+)(?::\d+)?\] ")
# The coordination service's and its client's source files.
_SERVICE = re.compile(rb"coordination|^client\.(?:h|cc)$|distributed")
_ERROR = b"error: "
_WAIT_CHARS = 4096
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


def fatal_message(held: bytes) -> str:
    text = held.decode(errors="replace")
    first = text.split("] ", 1)[-1]
    reason = first.split("absl::Status:", 1)[-1] if "absl::Status:" in first else first
    reason = " ".join(reason.split("*** Check failure stack trace")[0].split())
    return reason if len(reason) <= _SHOWN_CHARS else reason[: _SHOWN_CHARS - 3] + "..."


class OutputFilter:
    """Copies the child's stderr line by line (a progress bar's ``\\r`` ends one too) until
    it holds back (module doc)."""

    def __init__(self, out):
        # held: from the first line held back on; fatal: from the fatal line on
        self.out, self.held, self.fatal, self.error = out, None, None, False

    def _write(self, data: bytes) -> None:
        self.out.write(data)
        self.out.flush()

    def line(self, line: bytes) -> None:
        log = _LOG.match(line)
        if log and log.group(1) == b"F" and self.fatal is None:
            self.fatal = b""
        if self.fatal is not None:
            self.fatal += line
        service = log and log.group(1) in b"WE" and _SERVICE.search(log.group(2))
        if self.held is None and log and (log.group(1) == b"F" or service):
            self.held = b""
        if line.startswith(_ERROR) and not self.error:
            self.error = True
            self._write(line)
            self.held = b"" if self.held is None else self.held
        elif self.held is not None:
            self.held += line
        else:
            self._write(line)

    def feed(self, stream) -> None:
        pending = b""
        while chunk := os.read(stream.fileno(), 65536):
            pending += chunk
            while (cut := _line_end(pending)) > 0:
                self.line(pending[:cut])
                pending = pending[cut:]
            # A line without its end yet waits, unless it is too long to be one to hold.
            if len(pending) > _WAIT_CHARS and self.held is None:
                self._write(pending)
                pending = b""
        if pending:
            self.line(pending)


def _line_end(data: bytes) -> int:
    ends = [i for i in (data.find(b"\n"), data.find(b"\r")) if i >= 0]
    return min(ends) + 1 if ends else 0


def pass_through(stream, out) -> bytes | None:
    """Copies ``stream`` to ``out`` until a fatal log line; returns what came from that line
    on (None without one)."""
    f = OutputFilter(out)
    f.feed(stream)
    return f.fatal


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
    f = OutputFilter(sys.stderr.buffer)
    f.feed(child.stderr)
    return finish(f, child.wait())


def finish(f: OutputFilter, code: int) -> int:
    """The command's exit status once the child ended with ``code`` (see the module doc)."""
    held = f.held
    if f.error and code in (2, -signal.SIGABRT):  # its own line said why
        return 2
    if f.fatal is not None and code == -signal.SIGABRT:
        reason = fatal_message(f.fatal)
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
