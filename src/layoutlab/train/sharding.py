"""Data parallelism with ``jax.sharding``: one mesh axis ``"data"``, batches split along it.

The train state is replicated and every batch is split on its leading axis; XLA's SPMD
partitioner inserts the gradient all-reduce (and the cross-device BatchNorm statistics), so
the step function is the single-device one. Under ``jax.distributed.initialize()`` the mesh
spans every process's devices; each process builds the same global batch (the input pipeline
is a function of the seed and step) and ``jax.device_put`` keeps its own shards.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = ["DATA_AXIS", "Shardings", "make_shardings"]

DATA_AXIS = "data"


class Shardings(NamedTuple):
    mesh: Mesh
    replicated: NamedSharding  # the train state, metrics, a partial eval batch
    batch: NamedSharding  # leading axis split over the devices

    @property
    def num_devices(self) -> int:
        return self.mesh.devices.size


def make_shardings(data_parallel: bool) -> Shardings:
    """A 1D mesh over all devices (or the first one only when ``data_parallel`` is off)."""
    devices = jax.devices() if data_parallel else jax.local_devices()[:1]
    mesh = Mesh(np.asarray(devices), (DATA_AXIS,))
    return Shardings(
        mesh=mesh,
        replicated=NamedSharding(mesh, PartitionSpec()),
        batch=NamedSharding(mesh, PartitionSpec(DATA_AXIS)),
    )
