"""prefetch_to_device: order, sharding, exceptions from the producer, early stop."""

import threading
import time

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from layoutlab.data import epoch_batches, make_synthetic, prefetch_to_device


def _batches(n):
    for i in range(n):
        yield np.full((4, 2), i, np.float32), np.arange(4, dtype=np.int32) + i


def test_order_and_values_preserved():
    got = list(prefetch_to_device(_batches(7), size=2))
    assert len(got) == 7
    for i, (x, y) in enumerate(got):
        assert isinstance(x, jax.Array)
        np.testing.assert_array_equal(np.asarray(x), np.full((4, 2), i, np.float32))
        np.testing.assert_array_equal(np.asarray(y), np.arange(4) + i)


def test_sharding_splits_the_batch_over_devices():
    devices = np.array(jax.devices()[:4])
    sharding = NamedSharding(Mesh(devices, ("data",)), PartitionSpec("data"))
    ds = make_synthetic((4, 4, 1), 2, 40, seed=0)
    host = list(epoch_batches(ds, "train", 8, layout="NCHW", seed=2))
    for (hx, hy), (dx, dy) in zip(
        host, prefetch_to_device(iter(host), sharding=sharding), strict=True
    ):
        assert dx.sharding == sharding and dy.sharding == sharding
        assert len(dx.addressable_shards) == 4
        assert dx.addressable_shards[0].data.shape == (2, 1, 4, 4)
        np.testing.assert_array_equal(np.asarray(dx), hx)
        np.testing.assert_array_equal(np.asarray(dy), hy)


def test_producer_exception_reraises_in_consumer():
    def failing():
        yield from _batches(3)
        raise RuntimeError("disk on fire")

    it = prefetch_to_device(failing())
    assert [int(np.asarray(x)[0, 0]) for x, _ in (next(it), next(it), next(it))] == [0, 1, 2]
    with pytest.raises(RuntimeError, match="disk on fire"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)


def test_early_stop_ends_the_thread_and_closes_the_source():
    closed = threading.Event()

    def endless():
        try:
            i = 0
            while True:
                yield np.full((2,), i, np.int32)
                i += 1
        finally:
            closed.set()

    with prefetch_to_device(endless(), size=3) as it:
        first = [int(np.asarray(next(it))[0]) for _ in range(5)]
    assert first == [0, 1, 2, 3, 4]
    assert not it.alive and closed.is_set()

    # Dropping the iterator without close() stops the thread too.
    closed.clear()
    it = prefetch_to_device(endless(), size=1)
    next(it)
    thread = it._thread
    del it
    thread.join(timeout=5)
    assert not thread.is_alive() and closed.is_set()


def test_prefetch_runs_ahead_of_the_consumer_but_is_bounded():
    produced = []

    def source():
        for i in range(20):
            produced.append(i)
            yield np.zeros(1, np.float32)

    it = prefetch_to_device(source(), size=2)
    next(it)
    deadline = time.monotonic() + 5
    while len(produced) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    # One batch consumed, two in the queue, one read and waiting for room: four, no more.
    assert len(produced) == 4
    it.close()
    with pytest.raises(ValueError, match="size must be >= 1"):
        prefetch_to_device([], size=0)
