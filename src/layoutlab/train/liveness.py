"""The processes of a multi-process run watch each other, and stop together with one line.

JAX's coordination service ends every process with a C++ stack trace when it loses one (a
process killed, crashed, or gone from the shutdown barrier), after its heartbeat timeout;
its client's callback cannot be replaced from Python. So once joined, each process runs a
watchdog thread that says "alive" in the service's key-value store every second and
watches: process 0 watches every process, the others process 0 (whose process serves the
store) and the run's failure record. A process silent for the join timeout, a failure
another process recorded (``report_failure``), or a store that stops answering ends the
process with one ``error:`` line and exit code 2, before JAX's heartbeat timeout, which
``initialize_distributed`` sets past the watchdog's; a killed process is noticed sooner,
when its link to process 0 closes (``train.peer_links``). A process that printed its own error
(``stop_with``) exits quietly when the watchdog fires.

A process that stopped with its error line ends there: JAX's exit handler would wait at the
shutdown barrier for processes that are stopping too, and its client aborts the process with
a C++ stack trace once process 0, which serves the store, is gone. So at exit a failed
process marks itself done, process 0 first waits (a few seconds at most) until the others
did, and the process ends with exit code 2 without JAX's shutdown.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time

from layoutlab.train.peer_links import link_peers

__all__ = ["leave", "recorded_failure", "report_failure", "start_watchdog", "stop_with"]

_PREFIX = "layoutlab/"
FAILED = _PREFIX + "failed"
_ALIVE = _PREFIX + "alive/"
_DONE = "done"
_BEAT_S = 1.0
# How long the watchdog leaves the main thread to report a failure it will notice itself
# (a wait that polls the failure record), so that the process prints one line, not two.
_GRACE_S = 3.0
# How long an exiting process waits for its watchdog's store calls to return.
_JOIN_S = 10.0
# How often a process stopped by the user looks whether the others have stopped (leave).
_LEAVE_POLL_S = 0.1

_printed = threading.Event()  # this process printed its error
_gone: set[int] = set()  # processes whose link to process 0 closed (``_closed``) line
_watchdogs: list[tuple] = []  # start_watchdog's, and its timeout, for leave
_lock = threading.Lock()


def _one_line(text) -> str:
    return " ".join(str(text).split())


def _client():
    from jax._src import distributed

    return distributed.global_state.client


def _print_once(message: str, *, again: bool = False) -> bool:
    """Prints the error unless one was printed already; ``again``: print it regardless (each
    command run's own error, which in-process callers such as tests make many of)."""
    with _lock:
        if _printed.is_set() and not again:
            return False
        _printed.set()
    print(f"error: {_one_line(message)}", file=sys.stderr, flush=True)
    return True


def report_failure(message: str) -> None:
    """Records in the run's store that this process stopped, and why (the first record
    wins), for the other processes; nothing in a single process or without a store."""
    try:
        if (client := _client()) is None:  # not joined (no JAX backend started for this)
            return
        import jax

        if jax.process_count() == 1:
            return
        _record(client, f"process {jax.process_index()} stopped: {_one_line(message)}")
    except Exception:  # the store is gone
        pass


def _record(client, text: str) -> None:
    """The run's failure record, unless another process recorded first (the first wins)."""
    try:
        client.key_value_set(FAILED, text)
    except Exception:
        pass


def recorded_failure(wait_s: float) -> str | None:
    """The run's failure record, waiting up to ``wait_s`` for one; None in a single process,
    without a store, or when none came. A collective that failed because a process died can
    fail before that process's link closes and names it (``_closed``), so a caller that saw
    such a failure asks here for the cause first."""
    try:
        if (client := _client()) is None:
            return None
        deadline = time.monotonic() + wait_s
        while True:
            if (found := _try_get(client, FAILED)) is not None:
                return found
            if time.monotonic() >= deadline:
                return None
            time.sleep(_LEAVE_POLL_S)
    except Exception:  # the store is gone
        return None


def stop_with(message: str) -> int:
    """Prints ``error: message`` and records the failure for the other
    processes of a distributed run; returns the exit code, 2."""
    _print_once(message, again=True)
    report_failure(message)
    return 2


def _exit(message: str, client=None, me: int | None = None) -> None:
    _print_once(message)  # quiet when this process printed its error already
    if client is not None:
        _mark_done(client, me)
        if me == 0:  # its end takes the service away: let a leaving process go first
            sys.stderr.flush()  # its one line is out; what fails meanwhile stays unsaid
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())
            time.sleep(_LEAVE_POLL_S * 5)
    _end()


def _end() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(2)


def _mark_done(client, me: int) -> None:
    try:
        client.key_value_set(f"{_ALIVE}{me}", _DONE, allow_overwrite=True)
    except Exception:
        pass


def _wait_for_peers(client, count: int, wait_s: float) -> None:
    """Process 0, failing: until every other process marked itself done (it learns of the
    failure within a few beats), for at most ``wait_s``; its store dies with this process."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            waiting = [p for p in range(1, count) if p not in _gone]
            if all(_try_get(client, f"{_ALIVE}{p}") == _DONE for p in waiting):
                return
        except Exception:
            return
        time.sleep(0.1)


def leave(code: int) -> int:
    """A distributed run's process stopped by the user (Ctrl-C, SIGTERM), after
    ``report_failure``: ends with ``code`` without JAX's shutdown barrier, which the other
    processes, stopping on that record, never join (process 0 would wait in it for the
    heartbeat timeout and then abort). It waits, for at most the join timeout, until the
    others have stopped on the record (each marks itself done; process 0, whose end takes
    the service away and would make JAX abort the rest, lingers after that long enough for
    a waiting process to see it). Returns ``code`` in a single process."""
    import jax

    if jax.process_count() == 1 or (client := _client()) is None:
        return code
    # This process's own watchdog would end it on its own failure record.
    for watch_client, me, watchdog, stop, _ in _watchdogs:
        stop.set()
        watchdog.join(timeout=_JOIN_S)
        _mark_done(watch_client, me)
    others = [p for p in range(jax.process_count()) if p != jax.process_index()]
    deadline = time.monotonic() + max((w[4] for w in _watchdogs), default=_JOIN_S)
    while others and time.monotonic() < deadline:
        try:
            others = [
                p for p in others if p not in _gone and _try_get(client, f"{_ALIVE}{p}") != _DONE
            ]
        except Exception:
            break
        time.sleep(_LEAVE_POLL_S)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _try_get(client, key: str) -> str | None:
    try:
        return str(client.key_value_try_get(key))
    except Exception as e:
        if "NOT_FOUND" in str(e):
            return None
        raise


def _watch(client, me: int, count: int, timeout_s: float, stop: threading.Event) -> None:
    peers = range(1, count) if me == 0 else [0]
    now = time.monotonic()
    seen = {p: (None, now) for p in peers}
    beats, failing_since, store_ok = 0, None, now
    while not stop.wait(_BEAT_S):
        now = time.monotonic()
        try:
            beats += 1
            client.key_value_set(f"{_ALIVE}{me}", str(beats), allow_overwrite=True)
            failed = _try_get(client, FAILED)
            for p in peers:
                value, since = seen[p]
                beat = _try_get(client, f"{_ALIVE}{p}")
                if beat != value:
                    seen[p] = (beat, now)
                elif beat != _DONE and now - since > timeout_s:
                    _record(
                        client,
                        f"process {p} stopped answering for {timeout_s:g} s (killed, crashed "
                        "or hung; its own output names the cause)",
                    )
                    failed = failed or _try_get(client, FAILED)
            store_ok = now
        except Exception as e:  # the store is gone: process 0 stopped
            if now - store_ok > timeout_s:
                _exit(
                    f"lost the distributed run's coordinator (process 0) for {timeout_s:g} s "
                    f"({_one_line(e)[:200]}); process 0's output names the cause."
                )
            continue
        if failed is None:
            failing_since = None
        elif failing_since is None:
            failing_since = now
        elif now - failing_since > _GRACE_S:
            _exit(f"the distributed run stopped: {failed}", client, me)


def _done(
    client,
    me: int,
    watchdog: threading.Thread,
    stop: threading.Event,
    count: int = 1,
    unlink=None,
) -> None:
    """At exit: stop the watchdog, then tell the others this process finished, so that they
    do not mistake it for a dead one (a beat after that would undo it). The watchdog and
    process 0's link thread (``unlink``) must be out of the client's calls before the
    interpreter finalizes: a daemon thread that comes back from C++ then is unwound by
    force, which the client's bindings catch without rethrowing, and the process aborts
    ("FATAL: exception not rethrown") instead of exiting with its status. A process that
    printed its error then ends (module doc)."""
    stop.set()
    watchdog.join(timeout=_JOIN_S)
    _mark_done(client, me)
    if _printed.is_set():
        if me == 0:
            _wait_for_peers(client, count, _JOIN_S)
        _end()
    if unlink is not None:
        unlink(_JOIN_S)


def _closed(client, k: int) -> None:
    """Process ``k``'s link to process 0 closed: its process ended, and unless it marked
    itself done first, it was killed or crashed (``train.peer_links``)."""
    _gone.add(k)
    try:
        if _try_get(client, f"{_ALIVE}{k}") == _DONE:
            return
    except Exception:
        return
    _record(
        client,
        f"process {k} ended without finishing (killed or crashed; its own output, if any, "
        "names the cause)",
    )


def start_watchdog(timeout_s: float) -> None:
    """Starts this process's watchdog (see the module doc); nothing in a single process."""
    import jax

    client = _client()
    if jax.process_count() == 1 or client is None:
        return
    me, stop = jax.process_index(), threading.Event()
    args = (client, me, jax.process_count(), timeout_s, stop)
    unlink = link_peers(client, me, jax.process_count(), lambda k: _closed(client, k))
    watchdog = threading.Thread(target=_watch, args=args, daemon=True, name="layoutlab-liveness")
    watchdog.start()
    # Runs before JAX's own exit handler, which was registered first.
    atexit.register(_done, client, me, watchdog, stop, jax.process_count(), unlink)
    _watchdogs.append((client, me, watchdog, stop, timeout_s))
