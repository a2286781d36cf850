"""A killed process of a multi-process run is noticed at once, not after a timeout.

The liveness watchdog (``train.liveness``) notices a process that stopped beating only
after the join timeout (30-120 s): a process may be busy, and a beat tells a slow process
from a dead one no sooner. A process's end does tell: its operating system closes its
sockets, even after a kill -9. So every other process keeps one TCP connection open to
process 0 (on a port process 0 picks and publishes in the coordination service's store,
on the coordinator's host), and process 0 records a failure for the others as soon as a
connection closes before its process marked itself done (at exit, ``liveness._done``).
Where the connection cannot be made (a firewall), the watchdog's timeout still holds.
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


def _serve(server: socket.socket, count: int, closed: Callable[[int], None]) -> None:
    links: dict[socket.socket, int] = {}
    pending, accepted = [server], 0
    while pending or links:
        ready, _, _ = select.select([*pending, *links], [], [])
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


def link_peers(client, me: int, count: int, closed: Callable[[int], None]) -> None:
    """Process 0 listens and calls ``closed(k)`` from a thread when process ``k``'s link
    closes; every other process connects (see the module doc). Never raises."""
    try:
        if me == 0:
            server = _listen()
            client.key_value_set(_PORT_KEY, str(server.getsockname()[1] if server else "none"))
            if server is not None:
                _open.append(server)
                args = (server, count - 1, closed)
                name = "layoutlab-links"
                threading.Thread(target=_serve, args=args, daemon=True, name=name).start()
            return
        host = _coordinator_host()
        port = client.blocking_key_value_get(_PORT_KEY, int(_CONNECT_S * 1000))
        if host is None or not str(port).isdigit():
            return
        port = int(port)
        link = socket.create_connection((host, port), timeout=_CONNECT_S)
        link.settimeout(None)
        link.sendall(f"{me}\n".encode())
        _open.append(link)
    except Exception:  # no link: the watchdog's timeout still notices a lost process
        return
