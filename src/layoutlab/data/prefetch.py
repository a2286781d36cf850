"""Host-side prefetch: a background thread reads batches and starts their device transfer early.

This is the JAX counterpart of a PyTorch DataLoader's ``num_workers``/``pin_memory``: while the
device runs step ``t``, the thread builds batch ``t + 1`` on the host and ``jax.device_put``
copies it (asynchronously) to the device or to a sharding across devices.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator

import jax

__all__ = ["Prefetcher", "prefetch_to_device"]

# The producer wakes up this often to see whether the consumer has gone away.
_POLL_S = 0.05


class _Done:
    pass


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


def _put(q: queue.Queue, stop: threading.Event, item) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            continue
    return False


def _produce(iterator: Iterator, put, q: queue.Queue, stop: threading.Event) -> None:
    # A function of its own, not a method: the thread must not keep the Prefetcher alive, so
    # that dropping the Prefetcher (its __del__) stops the thread.
    try:
        for batch in iterator:
            if not _put(q, stop, put(batch)):
                return
        _put(q, stop, _Done())
    except BaseException as e:  # handed to the consumer, which re-raises it
        _put(q, stop, _Failed(e))
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


def _device_put(sharding):
    return lambda batch: jax.device_put(batch, sharding)


class Prefetcher(Iterator):
    """Iterator over device batches filled by a daemon thread; ``close()`` stops the thread."""

    def __init__(self, iterable: Iterable, size: int = 2, sharding=None, put=None):
        if size < 1:
            raise ValueError(f"Prefetch size must be >= 1, got {size}.")
        self._queue: queue.Queue = queue.Queue(maxsize=size)
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(
            target=_produce,
            args=(iter(iterable), put or _device_put(sharding), self._queue, self._stop),
            daemon=True,
            name="prefetch_to_device",
        )
        self._thread.start()

    def __next__(self):
        if self._finished:
            raise StopIteration
        item = self._queue.get()
        if isinstance(item, _Done):
            self._finished = True
            raise StopIteration
        if isinstance(item, _Failed):
            self._finished = True
            raise item.error
        return item

    def close(self) -> None:
        """Stop the producer thread and drop batches it has read ahead."""
        self._finished = True
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join()

    @property
    def alive(self) -> bool:
        """Whether the producer thread is still running."""
        return self._thread.is_alive()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        stop = getattr(self, "_stop", None)  # absent when __init__ raised
        if stop is not None:
            stop.set()


def prefetch_to_device(
    iterable: Iterable, size: int = 2, sharding=None, put=None
) -> Prefetcher:
    """Iterate ``iterable`` in a background thread, ``jax.device_put`` each batch ahead.

    ``size`` batches are kept in flight. ``sharding`` (e.g. a ``NamedSharding`` splitting the
    batch axis over a mesh, or a pytree of shardings) is passed to ``jax.device_put``; ``None``
    puts batches on the default device. ``put(batch)`` replaces ``jax.device_put`` (e.g.
    assembling a global array from one process's rows, which writes local devices only:
    ``jax.device_put`` of a global array runs a cross-process check, a collective that must
    not run on this thread). An exception in the producer is re-raised by ``next()``;
    leaving a ``with`` block or calling ``close()`` stops the thread early.
    """
    return Prefetcher(iterable, size=size, sharding=sharding, put=put)
