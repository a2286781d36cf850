"""A killed process of a multi-process run is noticed at once, not after a timeout.

The liveness watchdog (``train.liveness``) notices a process that stopped beating only
after the join timeout (30-120 s): a process may be busy, and a beat tells a slow process
from a dead one no sooner. A process's end does tell: its operating system closes its
sockets, even after a kill -9. So every other process keeps one TCP connection open to
process 0 (on a port process 0 picks and publishes in the coordination service's store,
on the coordinator's host), and process 0 records a failure for the others as soon as a
connection closes before its process marked itself done (at exit, ``liveness._done``).
Where the connection cannot be made (a firewall), the watchdog's timeout still holds.

Process 0's thread calls into the coordination client when a link closes, so it must be out
of those calls before the interpreter finalizes (``liveness._done``): ``link_peers``
returns the function that wakes it and waits for it to end.
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Callable

__all__ = ["link_peers"]

_PORT_KEY = "layoutlab/links/port"
_CONNECT_S = 5.0
# Sockets that must stay open for the process's life (a collected one would close).
_open: list[socket.socket] = []


def _coordinator_host() -> str | None:
    from jax._src import distributed

    address = distributed.global_state.coordinator_address
    if not address:
        return None
    return address.rpartition(":")[0].strip("[]") or None


def _listen() -> socket.socket | None:
    """A socket listening on every interface, as the coordinator's does, on a free port."""
    try:
        return socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    except (OSError, ValueError):  # no IPv6 here
        try:
            return socket.create_server(("", 0))
        except OSError:
            return None


def _serve(
    server: socket.socket, count: int, closed: Callable[[int], None], wake: socket.socket
) -> None:
    links: dict[socket.socket, int] = {}
    pending, accepted = [server], 0
    while pending or links:
        ready, _, _ = select.select([wake, *pending, *links], [], [])
        if wake in ready:  # the process is exiting (``stop`` below)
            return
        for s in ready:
            if s is server:
                peer, _ = server.accept()
                pending.append(peer)
                accepted += 1
                if accepted == count:  # every peer connected: no more to accept
                    pending.remove(server)
                    server.close()
                continue
            try:
                data = s.recv(64)
            except OSError:
                data = b""
            if s in pending:  # a new link says whose it is
                pending.remove(s)
                if data.strip().isdigit():
                    links[s] = int(data)
                continue
            if not data:  # its process ended
                k = links.pop(s)
                s.close()
                closed(k)


def _nothing(timeout_s: float) -> None:
    return None


def link_peers(
    client, me: int, count: int, closed: Callable[[int], None]
) -> Callable[[float], None]:
    """Process 0 listens and calls ``closed(k)`` from a thread when process ``k``'s link
    closes; every other process connects (see the module doc). Never raises. Returns
    ``stop(timeout_s)``, which ends process 0's thread and waits for it, at most
    ``timeout_s`` (it may be in a ``closed`` call); on the others it does nothing."""
    try:
        if me == 0:
            server = _listen()
            client.key_value_set(_PORT_KEY, str(server.getsockname()[1] if server else "none"))
            if server is None:
                return _nothing
            _open.append(server)
            wake, waker = socket.socketpair()
            _open.extend((wake, waker))
            args = (server, count - 1, closed, wake)
            name = "layoutlab-links"
            thread = threading.Thread(target=_serve, args=args, daemon=True, name=name)
            thread.start()

            def stop(timeout_s: float) -> None:
                try:
                    waker.send(b"x")
                except OSError:
                    pass
                thread.join(timeout=timeout_s)

            return stop
        host = _coordinator_host()
        port = client.blocking_key_value_get(_PORT_KEY, int(_CONNECT_S * 1000))
        if host is None or not str(port).isdigit():
            return _nothing
        port = int(port)
        link = socket.create_connection((host, port), timeout=_CONNECT_S)
        link.settimeout(None)
        link.sendall(f"{me}\n".encode())
        _open.append(link)
    except Exception:  # no link: the watchdog's timeout still notices a lost process
        pass
    return _nothing
