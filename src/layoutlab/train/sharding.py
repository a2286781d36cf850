"""Data parallelism with ``jax.sharding``: one mesh axis ``"data"``, batches split along it.

The train state is replicated and every batch is split on its leading axis; XLA's SPMD
partitioner inserts the gradient all-reduce (and the cross-device BatchNorm statistics), so
the step function is the single-device one. Under ``jax.distributed.initialize()`` the mesh
spans every process's devices; each process builds only its rows of every global batch
(``local_rows``; the input pipeline is a function of the seed and step, so the global batch
is the one-process one) and ``assemble`` makes the global array from them.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = [
    "DATA_AXIS",
    "PARAM_SHARDINGS",
    "Shardings",
    "assemble",
    "fsdp_spec",
    "local_rows",
    "make_shardings",
    "state_shardings",
]

# "replicated": every device holds the whole state (plain data parallelism). "fsdp": each
# parameter and optimizer-state array is split over the data axis too (ZeRO-3/FSDP style),
# so each of N devices holds about 1/N of it and XLA gathers weights where a step needs them.
PARAM_SHARDINGS = ("replicated", "fsdp")

DATA_AXIS = "data"


class Shardings(NamedTuple):
    mesh: Mesh
    replicated: NamedSharding  # the train state, metrics
    batch: NamedSharding  # leading axis split over the devices

    @property
    def num_devices(self) -> int:
        return self.mesh.devices.size


def make_shardings(data_parallel: bool) -> Shardings:
    """A 1D mesh over all devices (or the first one only when ``data_parallel`` is off)."""
    if not data_parallel and jax.process_count() > 1:
        raise ValueError(
            f"data_parallel=false trains on one device, but this run has "
            f"{jax.process_count()} processes; leave data_parallel on for a distributed run."
        )
    devices = jax.devices() if data_parallel else jax.local_devices()[:1]
    mesh = Mesh(np.asarray(devices), (DATA_AXIS,))
    return Shardings(
        mesh=mesh,
        replicated=NamedSharding(mesh, PartitionSpec()),
        batch=NamedSharding(mesh, PartitionSpec(DATA_AXIS)),
    )


def local_rows(sharding, batch: int) -> tuple[tuple[int, int], ...] | None:
    """The ``(start, stop)`` rows of a ``batch``-row global array that this process's devices
    hold under ``sharding``, in order; None when they hold all of it (one process)."""
    if sharding.is_fully_addressable:
        return None
    index_map = sharding.addressable_devices_indices_map((batch,))
    return tuple(sorted({(s[0].start or 0, batch if s[0].stop is None else s[0].stop)
                         for s in index_map.values()}))  # fmt: skip


def assemble(sharding, local: tuple[np.ndarray, ...], batch: int) -> tuple[jax.Array, ...]:
    """Global arrays of ``batch`` rows from this process's rows (``local_rows``) of each.

    Only local devices are written: no cross-process check or transfer, so a prefetch thread
    may call it (``jax.device_put`` of a global array compares it across processes, a
    collective that must not run off the main thread). With one process it is
    ``jax.device_put``.
    """
    return tuple(
        jax.make_array_from_process_local_data(sharding, x, (batch, *x.shape[1:])) for x in local
    )


def fsdp_spec(shape: tuple[int, ...], devices: int) -> PartitionSpec:
    """Split the largest axis that divides evenly over the devices; replicate if none does
    (scalars, biases shorter than the device count)."""
    axes = [i for i, n in enumerate(shape) if n % devices == 0 and n >= devices]
    if devices == 1 or not axes:
        return PartitionSpec()
    axis = max(axes, key=lambda i: shape[i])
    return PartitionSpec(*([None] * axis), DATA_AXIS)


def state_shardings(abstract_state, shard: Shardings, mode: str):
    """A sharding per leaf of the train state: all replicated, or FSDP-split (``mode``)."""
    if mode not in PARAM_SHARDINGS:
        raise ValueError(f"param_sharding must be one of {PARAM_SHARDINGS}, got {mode!r}.")
    if mode == "replicated":
        return jax.tree.map(lambda _: shard.replicated, abstract_state)

    def leaf(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return shard.replicated  # key arrays stay whole
        return NamedSharding(shard.mesh, fsdp_spec(tuple(x.shape), shard.num_devices))

    return jax.tree.map(leaf, abstract_state)
