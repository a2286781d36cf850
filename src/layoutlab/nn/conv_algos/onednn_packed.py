"""Inference with each oneDNN conv's kernel reordered once, not on every call.

oneDNN's forward reads its kernel in a blocked format of its own, so every call reorders the
HWIO kernel first (and rounds a float32 kernel to bfloat16). In a training step the kernel
changes each step and that is the price; in inference it is the same kernel every call, and
the reorder took more time than the convs themselves in a ``mixed_bf16`` ResNet-18 at batch 1
(docs/performance/measurements.md#packed-kernels). PyTorch's ``torch.compile`` freezing and
oneDNN's own graph API do the same: pack the weights once, then run on the packed copy.

- ``pack_kernels(fn, *args) -> PackedKernels``: traces ``fn(*args)`` (a jitted inference
  forward's function, its parameters among ``args``) and computes, in one compiled program,
  the packed kernel of every ``nn.Conv`` call that runs oneDNN's forward with a reorder, and
  the widened kernel of every widened one that reads its kernel as it is.
- ``with_packed_kernels(fn, packed.keys) -> g``: ``g(packed.blobs, *args)`` is ``fn(*args)``
  with those convs reading the packed kernels (a jit argument like the parameters) instead.
  A conv called at another shape than it was packed for (the last, smaller batch of an
  evaluation) runs as before, reordering its kernel.

A widened conv (``PlanEntry.compute_dtype``: ``mixed_bf16`` on a CPU without bfloat16
units) rounds and widens its kernel in every call; packing does that once, into the reordered
kernel or, where oneDNN reads the kernel as it is, into a float32 HWIO copy that the call
reads instead.

The packed forward runs the same primitive on the same reordered kernel, so its output has
the same bits. Packing is for single-device programs: the calls are not batch-partitioned.
A widened copy is the float32 HWIO kernel. A packed kernel is a ``uint8`` array shaped
``(kh, kw, in / groups, out, r)`` with ``r`` bytes per kernel element (padding included), so
its shape still tells the conv's work.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import weakref
from collections.abc import Callable, Iterator
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from layoutlab.nn.conv_algos.geometry import kernel_to_hwio
from layoutlab.nn.conv_algos.onednn_load import PACK_TARGETS, impl_info, register_targets
from layoutlab.nn.conv_intercept import intercept_convs

__all__ = ["PackedKernels", "pack_kernels", "packed_forward", "with_packed_kernels"]

_DT = {0: jnp.float32, 1: jnp.bfloat16}
# Marks a key whose blob is a widened conv's HWIO kernel, not a reordered one.
_WIDENED = -1


class PackedKernels(NamedTuple):
    """``keys``: each packed conv call's parameter tuple, in call order (static);
    ``blobs``: the packed kernels (arrays)."""

    keys: tuple[tuple[int, ...] | None, ...]
    blobs: tuple[jax.Array, ...]


class _Slot:
    """One ``Conv`` call's exchange with the forward below it: ``key`` the forward's
    parameters (set by the forward), ``blob`` the packed kernel to read (set by the caller)."""

    def __init__(self, blob=None, key=None):
        self.blob, self.key, self.seen = blob, key, None


_SLOT: contextvars.ContextVar[_Slot | None] = contextvars.ContextVar(
    "layoutlab_onednn_pack_slot", default=None
)


@contextlib.contextmanager
def _slot(slot: _Slot) -> Iterator[_Slot]:
    token = _SLOT.set(slot)
    try:
        yield slot
    finally:
        _SLOT.reset(token)


def packed_forward(params: tuple[int, ...], x, plain: Callable):
    """The forward of ``params`` (the extension's tuple) on ``x``: through the current slot's
    packed kernel when the slot was packed for exactly these parameters, ``plain(kernel)``
    on the slot's widened kernel when it holds one for them, else ``plain()`` (on the
    forward's own kernel). Called by ``onednn``'s forward while it is traced."""
    slot = _SLOT.get()
    if slot is None:
        return plain()
    slot.seen = params
    if slot.blob is not None and slot.key == (*params, _WIDENED):
        return plain(slot.blob)
    if slot.blob is None or slot.key != params:
        return plain()
    out = _out_struct(params)
    call = jax.ffi.ffi_call(PACK_TARGETS["fwd_packed"], out, vmap_method="sequential")
    return call(x, slot.blob, params=np.asarray(params, np.int64))


def _out_struct(params) -> jax.ShapeDtypeStruct:
    (op, _, _, dst, nchw, n, _, _, _, o, _, _, oh, ow) = params[:14]
    shape = (n, o, oh, ow) if nchw else (n, oh, ow, o)
    return jax.ShapeDtypeStruct(shape, _DT[dst])


def _packable(params) -> bool:
    info = impl_info(tuple(params))
    return not isinstance(info, str) and bool(info[1])


def _widens(conv) -> bool:
    entry = conv.plan_entry
    return entry is not None and entry.compute_dtype is not None


def _widened_kernel(conv) -> jax.Array:
    """The HWIO kernel a widened conv (``PlanEntry.compute_dtype``) multiplies: rounded to
    the layer's dtype, then widened, as ``conv2d`` computes it on every call."""
    w = kernel_to_hwio(conv.kernel[...], conv.kernel_spec)
    return w.astype(conv.policy.compute_dtype).astype(conv.plan_entry.compute_dtype)


def _pack(conv, params) -> jax.Array:
    """The packed kernel of ``conv`` (its stored kernel, in any order and dtype) for
    ``params``, computed where the caller traces."""
    register_targets()
    wei_dt = params[2]
    w = (
        _widened_kernel(conv)
        if _widens(conv)
        else kernel_to_hwio(conv.kernel[...], conv.kernel_spec)
    )
    w = w.astype(_DT[wei_dt])
    size = impl_info(tuple(params))[3]
    r = -(-size // math.prod(w.shape))
    out = jax.ShapeDtypeStruct((*w.shape, r), jnp.uint8)
    call = jax.ffi.ffi_call(PACK_TARGETS["conv_pack"], out, vmap_method="sequential")
    return call(w, params=np.asarray(params, np.int64))


# fn -> {argument shapes: (keys, compiled packing program)}: a forward packed again (a run
# opened again, a new batch of the same shape) neither traces nor compiles again.
_PROGRAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def pack_kernels(fn: Callable, *args) -> PackedKernels:
    """The packed kernels of ``fn(*args)``'s oneDNN forwards (see the module docstring),
    computed by one compiled program (kept per ``fn`` and argument shapes); no packs (every
    key None) where no conv runs oneDNN's forward with a reorder or widened."""
    if not _on_cpu(args):
        return PackedKernels((), ())  # the pack handlers are CPU custom calls
    programs = _PROGRAMS.setdefault(fn, {})
    shapes = tuple((a.shape, a.dtype) for a in jax.tree.leaves(args))
    if shapes not in programs:
        keys: list = []
        programs[shapes] = (keys, jax.jit(_collector(fn, keys)).lower(*args).compile())
    keys, program = programs[shapes]
    return PackedKernels(tuple(keys), tuple(program(*args)))


def _on_cpu(args) -> bool:
    arrays = [a for a in jax.tree.leaves(args) if isinstance(a, jax.Array)]
    platforms = {d.platform for a in arrays for d in a.devices()}
    return platforms <= {"cpu"} if arrays else jax.default_backend() == "cpu"


def _collector(fn: Callable, keys: list) -> Callable:
    """``fn``'s packing program: its packed kernels, ``keys`` filled while it is traced."""

    def collect(*args):
        blobs = []

        def intercept(conv, x):
            with _slot(_Slot()) as slot:
                y = conv.compute(x)
            key = slot.seen
            if key is not None and _packable(key):
                blobs.append(_pack(conv, key))
            elif key is not None and _widens(conv):
                # A kernel oneDNN reads as it is: the widened copy, made once here instead
                # of in every call (the rounding is a pass over the kernel).
                key = (*key, _WIDENED)
                blobs.append(_widened_kernel(conv))
            else:
                key = None
            keys.append(key)
            return y

        with intercept_convs(intercept):
            fn(*args)
        return blobs

    return collect


def with_packed_kernels(fn: Callable, keys: tuple) -> Callable:
    """``g(blobs, *args)``: ``fn(*args)`` with its oneDNN forwards reading ``blobs``
    (a ``PackedKernels``' ``blobs``, packed for its ``keys``), matched to the calls by order
    and parameters."""

    def run(blobs, *args):
        order = iter(keys)
        blob_of = iter(blobs)

        def intercept(conv, x):
            key = next(order, None)
            blob = next(blob_of) if key is not None else None
            with _slot(_Slot(blob, key)):
                return conv.compute(x)

        with intercept_convs(intercept):
            return fn(*args)

    return run
