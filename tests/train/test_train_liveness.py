"""The watchdog of a multi-process run at exit, with a fake coordination store.

Each process's watchdog thread writes a beat every second. At exit (``_done``, an atexit
handler) the thread must stop before the process marks itself finished: a beat written
after the "done" mark would make the others count a finished process as a silent one; and
a daemon thread still inside the store client's C++ calls when the interpreter finalizes
aborts the process instead of letting it exit with its status.
"""

from __future__ import annotations

import threading
import time

from layoutlab.train import liveness


class _Store:
    """The two calls the watchdog makes, recording the writes; ``slow_s`` per call."""

    def __init__(self, slow_s: float = 0.0):
        self.values, self.writes, self.slow_s = {}, [], slow_s
        self.lock = threading.Lock()

    def key_value_set(self, key, value, allow_overwrite=False):
        time.sleep(self.slow_s)
        with self.lock:
            self.values[key] = value
            self.writes.append((key, value))

    def key_value_try_get(self, key):
        time.sleep(self.slow_s)
        with self.lock:
            if key not in self.values:
                raise KeyError(f"NOT_FOUND: {key}")
            return self.values[key]


def _watchdog(store, monkeypatch, beat_s=0.01):
    monkeypatch.setattr(liveness, "_BEAT_S", beat_s)
    # No error printed yet (an in-process command of another test may have printed one).
    monkeypatch.setattr(liveness, "_printed", threading.Event())
    stop = threading.Event()
    store.values[f"{liveness._ALIVE}1"] = "1"  # the peer is alive
    thread = threading.Thread(target=liveness._watch, args=(store, 0, 2, 60.0, stop), daemon=True)
    thread.start()
    return thread, stop


def test_exit_stops_the_watchdog_before_marking_the_process_done(monkeypatch):
    store = _Store(slow_s=0.005)
    thread, stop = _watchdog(store, monkeypatch)
    deadline = time.monotonic() + 5
    while sum(k == f"{liveness._ALIVE}0" for k, _ in store.writes) < 3:
        assert time.monotonic() < deadline, "the watchdog wrote no beats"
        time.sleep(0.01)
    liveness._done(store, 0, thread, stop)
    assert not thread.is_alive()
    mine = [v for k, v in store.writes if k == f"{liveness._ALIVE}0"]
    assert mine[-1] == liveness._DONE
    time.sleep(0.1)  # several beats' time: nothing overwrites the mark
    assert store.values[f"{liveness._ALIVE}0"] == liveness._DONE


def test_exit_waits_at_most_the_join_timeout_for_a_hung_store(monkeypatch):
    """A store call that never returns (the coordinator gone) must not hang the exit."""
    store = _Store()
    thread, stop = _watchdog(store, monkeypatch)
    hang = threading.Event()
    store.key_value_try_get = lambda key: hang.wait() or "1"
    time.sleep(0.05)  # the watchdog is now inside the hung call
    monkeypatch.setattr(liveness, "_JOIN_S", 0.2)
    began = time.monotonic()
    liveness._done(store, 0, thread, stop)
    assert time.monotonic() - began < 2.0
    assert store.values[f"{liveness._ALIVE}0"] == liveness._DONE
    hang.set()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_a_failed_process_ends_without_jax_shutdown_once_the_others_are_done(monkeypatch):
    """A process that printed its error ends at exit (exit code 2), without JAX's shutdown
    barrier, whose client aborted with a C++ trace once process 0 was gone; process 0, whose
    store dies with it, first waits until the others marked themselves done."""
    store = _Store()
    thread, stop = _watchdog(store, monkeypatch)
    ended = []
    monkeypatch.setattr(liveness, "_end", lambda: ended.append(dict(store.values)))
    liveness._printed.set()  # this process printed its error
    threading.Timer(0.2, store.key_value_set, (f"{liveness._ALIVE}1", liveness._DONE)).start()
    liveness._done(store, 0, thread, stop, 2)
    assert len(ended) == 1
    assert ended[0][f"{liveness._ALIVE}0"] == ended[0][f"{liveness._ALIVE}1"] == liveness._DONE


def _link_threads():
    return [t for t in threading.enumerate() if t.name == "layoutlab-links"]


def test_exit_waits_for_process_0s_link_thread_inside_a_store_call(monkeypatch):
    """Process 0's link thread calls the store when a peer's link closes, which happens as
    the peers exit, so often while process 0 exits too; ``_done`` must see it out of that
    call (and ended) before the interpreter finalizes."""
    import socket

    from layoutlab.train.peer_links import link_peers

    store = _Store()
    thread, stop = _watchdog(store, monkeypatch)
    before = len(_link_threads())
    inside, calls = threading.Event(), []

    def closed(k):
        inside.set()
        time.sleep(0.3)  # a slow store call
        calls.append(k)

    unlink = link_peers(store, 0, 2, closed)
    port = int(store.values["layoutlab/links/port"])
    peer = socket.create_connection(("127.0.0.1", port), timeout=5)
    peer.sendall(b"1\n")
    time.sleep(0.05)  # the link is read as process 1's
    peer.close()  # process 1 ended
    assert inside.wait(5), "the link's close was not noticed"
    liveness._done(store, 0, thread, stop, 2, unlink)
    assert calls == [1]  # the call in progress finished before _done returned
    assert len(_link_threads()) == before


def test_exit_ends_an_idle_link_thread(monkeypatch):
    from layoutlab.train.peer_links import link_peers

    store = _Store()
    thread, stop = _watchdog(store, monkeypatch)
    before = len(_link_threads())
    unlink = link_peers(store, 0, 3, lambda k: None)
    assert len(_link_threads()) == before + 1
    liveness._done(store, 0, thread, stop, 3, unlink)
    assert len(_link_threads()) == before


def test_a_decision_returns_with_its_beat_thread_out_of_the_store(monkeypatch):
    """Process 0 beats while it decides alone (``agreement.decided_by_process_0``); the
    thread must be out of its store call when the decision returns, for the process may
    finalize soon after (a short run), and a daemon thread then in C++ aborts it."""
    import jax

    from layoutlab.train import agreement

    store = _Store(slow_s=0.2)  # each beat is a slow store call
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: 0)
    monkeypatch.setattr(agreement, "_client", lambda: store)
    monkeypatch.setattr(agreement, "_timeout_s", lambda: 60.0)
    monkeypatch.setattr(agreement, "_BEAT_S", 0.01)

    def decide():
        time.sleep(0.1)  # the beat thread is inside its first store call by now
        return 7

    assert agreement.decided_by_process_0("test decision", decide) == 7
    beats = [t for t in threading.enumerate() if t.name == "layoutlab-test decision-beat"]
    assert not beats
    assert any(k.endswith("/beat") for k, _ in store.writes)
