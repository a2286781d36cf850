"""Keep a batch-sharded op sharded: each device runs it on its own rows of the batch.

XLA's SPMD partitioner cannot see into a custom call (a oneDNN conv, say), so an opaque op
with a batch-sharded operand gets that operand all-gathered in front of it and runs whole on
every device. These wrappers tell the partitioner, through
``jax.experimental.custom_partitioning``, that the op is batch-parallel, so under
``jax.jit`` with ``NamedSharding`` inputs (the training's data-parallel and FSDP shardings,
``train/sharding.py``) each device calls ``fn`` on its shard:

- ``batch_parallel(fn, n_batched)(*operands)``: ``fn(*operands) -> result``, where
  ``operands[:n_batched]`` and ``result`` share the leading (batch) axis and the other
  operands (the kernel) are used whole. For a forward conv ``fn(x, w) -> y`` and an input
  gradient ``fn(dy, w) -> dx``, ``n_batched=1``.
- ``batch_reduced(fn)(*operands)``: ``fn(*operands) -> result``, where every operand has the
  batch axis and ``result`` sums over it, as a weight gradient ``fn(x, dy) -> dw`` does.
  Each device returns its shard's partial sum and one ``psum`` over the mesh axes that split
  the batch adds them; ``fn`` should return the accumulation dtype it wants summed.

``fn`` takes and returns arrays only (close over static arguments) and is traced once per
call, so build the wrapper where the op is traced. The leading axis stays split over the mesh
axes that split it in the first operand when it divides evenly; every other axis is run whole
(a kernel split by FSDP is gathered first, as XLA's own conv gathers it). With one device,
inside ``shard_map``, or with a replicated batch, ``fn`` is what runs: nothing is added. The
rule is given both ways: a sharding rule for Shardy (the partitioner this JAX uses by default)
and propagation callbacks for GSPMD.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

__all__ = ["batch_parallel", "batch_reduced"]


def _batch_axes(mesh, shape) -> tuple[str, ...]:
    """The mesh axes splitting ``shape``'s leading axis (a ShapeDtypeStruct with a sharding),
    or () when it is whole or does not divide evenly over them."""
    sharding = shape.sharding
    if not isinstance(sharding, NamedSharding) or not shape.shape or not sharding.spec:
        return ()
    lead = sharding.spec[0]
    axes = () if lead is None else (lead,) if isinstance(lead, str) else tuple(lead)
    size = math.prod(mesh.shape[a] for a in axes)
    return axes if axes and shape.shape[0] % size == 0 else ()


def _spec(mesh, axes: tuple[str, ...], ndim: int, batched: bool) -> NamedSharding:
    lead = (axes if len(axes) > 1 else axes[0],) if batched and axes else ()
    return NamedSharding(mesh, PartitionSpec(*lead, *([None] * (ndim - len(lead)))))


def _batched(k: int, n_batched: int | None) -> bool:
    return n_batched is None or k < n_batched


def _rule(n_batched: int | None, reduced: bool):
    """A Shardy rule: ``b`` is the batch factor, every other dimension needs replication."""

    def rule(mesh, operand_types, result_types):
        names: list[str] = []

        def dims(tag: str, rank: int, batched: bool) -> str:
            own = [f"{tag}{d}" for d in range(1 if batched else 0, rank)]
            names.extend(own)
            return " ".join((["b"] if batched else []) + own)

        ranks = [len(t.shape) for t in operand_types]
        ins = [dims(f"i{k}_", r, _batched(k, n_batched)) for k, r in enumerate(ranks)]
        out = dims("o", len(result_types[0].shape), not reduced)
        text = f"{', '.join(ins)} -> {out}"
        factors = {"need_replication_factors": tuple(names)}
        if reduced:
            factors["reduction_factors"] = ("b",)
        return text, factors

    return rule


def _wrap(fn: Callable, n_batched: int | None, reduced: bool) -> Callable:
    op = custom_partitioning(fn)

    def shardings(mesh, arg_shapes):
        axes = _batch_axes(mesh, arg_shapes[0])
        args = tuple(
            _spec(mesh, axes, len(s.shape), _batched(k, n_batched))
            for k, s in enumerate(arg_shapes)
        )
        return axes, args

    def infer(mesh, arg_shapes, result_shape):
        axes, _ = shardings(mesh, arg_shapes)
        return _spec(mesh, axes, len(result_shape.shape), not reduced)

    def partition(mesh, arg_shapes, result_shape):
        axes, args = shardings(mesh, arg_shapes)
        result = _spec(mesh, axes, len(result_shape.shape), not reduced)
        if reduced and axes:
            return mesh, lambda *a: jax.lax.psum(fn(*a), axes), result, args
        return mesh, fn, result, args

    op.def_partition(
        partition=partition,
        infer_sharding_from_operands=infer,
        sharding_rule=_rule(n_batched, reduced),
    )
    return op


def batch_parallel(fn: Callable, n_batched: int = 1) -> Callable:
    """``fn`` run per batch shard: its first ``n_batched`` operands and its result are split
    along the leading axis, the other operands are used whole (see the module docstring)."""
    if n_batched < 1:
        raise ValueError(f"n_batched must be at least 1, got {n_batched}.")
    return _wrap(fn, n_batched, reduced=False)


def batch_reduced(fn: Callable) -> Callable:
    """``fn`` run per batch shard, its results summed over the shards: every operand is split
    along the leading axis, the result is a sum over it (see the module docstring)."""
    return _wrap(fn, None, reduced=True)
