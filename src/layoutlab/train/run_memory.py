"""What a run needs in memory, estimated before anything is compiled or allocated.

The data set is checked as it loads (``data.memory``). Here, once the model is known as
shapes (``train.run_checks.check_dataset``), the run's train state and its largest per-batch
buffers are compared with the memory of the device they go on:

- the train state: the parameters, their gradients and the optimizer's float32 moments;
- the activations of a batch: the outputs of every operation of the forward pass, which
  the backward pass keeps (traced at two images, scaled to the batch), a rough bound;
- the eval step's confusion matrix, ``classes**2`` int32 cells, which it also indexes in
  int32, so a data set of more than 46340 classes cannot be evaluated at all.

A device that reports its memory (a GPU's ``bytes_limit``) is compared with that, at its share
of a data-parallel batch; a CPU with the host's available memory (``MemAvailable``; the data
set is already loaded then), which its devices share, at the whole batch.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
from flax import nnx

from layoutlab.data.memory import available_bytes
from layoutlab.train.config import TrainConfig
from layoutlab.train.config_checks import INT32_MAX

__all__ = ["PROBE_BATCH", "check_run_fits", "forward_bytes", "max_classes", "run_bytes"]

# Float32 moments the optimizer keeps per parameter.
_MOMENTS = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}
PROBE_BATCH = 2  # the batch the forward is traced at, in ``_check_dataset``


def max_classes() -> int:
    """The most classes the eval step counts: its confusion matrix has ``classes**2`` cells,
    indexed in int32."""
    return math.isqrt(INT32_MAX)


def _nbytes(x) -> int:
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):  # a few words each
        return 0
    return int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize


def forward_bytes(model: nnx.Module, images) -> int:
    """The bytes of every intermediate value of ``model``'s forward on ``images`` (shapes:
    it traces, computes nothing, and raises what calling the model would)."""
    graphdef, state = nnx.split(model)
    jaxpr = jax.make_jaxpr(lambda s, x: nnx.merge(graphdef, s)(x))(state, images)
    return sum(_nbytes(v.aval) for eqn in jaxpr.eqns for v in eqn.outvars)


def run_bytes(config: TrainConfig, model: nnx.Module, probe: int, classes: int) -> dict[str, int]:
    """The estimate, by part: ``state``, ``activations`` (at ``config.batch_size``, from
    ``probe``: ``forward_bytes`` of a batch of ``PROBE_BATCH``) and ``confusion``."""
    params = sum(_nbytes(p) for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
    count = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
    moments = 4 * count * _MOMENTS.get(config.optimizer, 2)
    return {
        "state": 2 * params + moments,
        "activations": probe * config.batch_size // PROBE_BATCH,
        "confusion": 4 * classes * classes,
    }


def _device_bytes() -> tuple[int | None, str, bool]:
    """``(bytes, what they are, whether the device has memory of its own)``: a GPU's limit,
    else the host's available memory, which every CPU device shares."""
    device = jax.local_devices()[0]
    try:
        stats = device.memory_stats() or {}
    except Exception:  # backends without memory statistics
        stats = {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), f"the {device.platform.upper()} holds", True
    return available_bytes(), "the machine has available (MemAvailable)", False


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB"


def check_run_fits(config: TrainConfig, model: nnx.Module, probe: int, classes: int) -> None:
    """Raises ``ValueError`` when the run cannot be evaluated (too many classes) or needs
    more memory than its device has, naming both figures and the fix."""
    if classes > max_classes():
        raise ValueError(
            f"{config.data!r} has {classes} classes, more than the {max_classes()} the "
            "evaluation counts (its confusion matrix has classes**2 cells, indexed in int32); "
            "use fewer classes."
        )
    have, where, own_memory = _device_bytes()
    if own_memory and config.data_parallel:  # each device holds its share of the batch
        config = dataclasses.replace(config, batch_size=-(-config.batch_size // jax.device_count()))
    parts = run_bytes(config, model, probe, classes)
    need = sum(parts.values())
    if have is None or need <= have:
        return
    detail = ", ".join(f"{name} {_gb(n)}" for name, n in parts.items())
    raise ValueError(
        f"the run needs about {_gb(need)} of memory ({detail}) but {where} {_gb(have)}; "
        "lower --batch-size, the image size or the model's width, or use a device with more "
        "memory."
    )
