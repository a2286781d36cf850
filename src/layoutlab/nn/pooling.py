"""Max, average, adaptive and global pooling in any layout (1D, 2D or 3D)."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from layoutlab.layout import Layout
from layoutlab.nn import pool_onednn
from layoutlab.nn.base import LayoutModule
from layoutlab.nn.padding import normalize_padding, normalize_tuple
from layoutlab.precision import Policy

__all__ = [
    "AdaptiveAvgPool",
    "AvgPool",
    "GlobalAvgPool",
    "MAX_POOL_IMPLS",
    "MaxPool",
    "adaptive_pool_matrix",
    "apply_separable",
    "check_max_pool_impl",
    "max_pool",
    "onednn_pool_reason",
    "xla_max_pool",
]


def _full_window(layout: Layout, spatial: tuple[int, ...], fill: int) -> tuple[int, ...]:
    """Expand per-spatial-dim values to all axes of ``layout``, ``fill`` elsewhere."""
    full = [fill] * layout.rank
    for axis, value in zip(layout.spatial_axes, spatial, strict=True):
        full[axis] = value
    return tuple(full)


class _Pool(LayoutModule):
    def __init__(
        self,
        kernel_size: int | Sequence[int],
        strides: int | Sequence[int] | None = None,
        padding: int | Sequence[int] | str = 0,
        *,
        layout: Layout = Layout.NHWC,
        policy: Policy | None = None,
    ):
        self._set_layout_policy(layout, policy)
        n = self.layout.num_spatial
        self.kernel_size = normalize_tuple(kernel_size, n, "kernel_size")
        self.strides = normalize_tuple(
            strides if strides is not None else kernel_size, n, "strides"
        )
        self.padding = normalize_padding(padding, n)

    def _window_args(self, x: jax.Array):
        self.layout.check_input(x.shape, None, self._name())
        dims = _full_window(self.layout, self.kernel_size, 1)
        strides = _full_window(self.layout, self.strides, 1)
        if isinstance(self.padding, str):
            return dims, strides, self.padding
        pads = [(0, 0)] * self.layout.rank
        for axis, pair in zip(self.layout.spatial_axes, self.padding, strict=True):
            pads[axis] = pair
        return dims, strides, tuple(pads)


# How ``max_pool`` computes: "auto" runs oneDNN's primitive on CPU where
# ``pool_onednn.supports`` finds nothing against it, "xla" always XLA's ops.
MAX_POOL_IMPLS = ("auto", "xla")


def max_pool(
    x, dims: tuple[int, ...], strides: tuple[int, ...], pads, impl: str = "auto"
) -> jax.Array:
    """Window maximum (padding counts as ``-inf``) whose gradient goes to the first maximum
    of each window in row-major window order, a NaN window's to its last NaN (see
    ``xla_max_pool``). ``impl="auto"`` (``MAX_POOL_IMPLS``): a 2D window over the middle axes
    of a float32 or bfloat16 array runs oneDNN's primitives on CPU where
    ``nn.pool_onednn.supports`` accepts it, with the same outputs and gradient routing
    (``tests/nn/test_onednn_pool.py``); ``"xla"``: always ``xla_max_pool``."""
    if onednn_pool_reason(x, dims, strides, pads, impl) is None:
        return pool_onednn.max_pool_nhwc(x, dims, strides, pads, _max_pool_bwd)
    return xla_max_pool(x, dims, strides, pads)


def onednn_pool_reason(x, dims, strides, pads, impl: str = "auto") -> str | None:
    """None when ``max_pool(x, dims, strides, pads, impl)`` runs oneDNN's primitives (``x``
    abstract is fine), else why it runs XLA's ops. Only overlapping windows go to oneDNN:
    there XLA's backward visits every window offset, while for windows no larger than their
    stride (VGG's 2x2/2) XLA's ops were as fast or faster in float32
    (benchmarks/ab_max_pool_onednn.py)."""
    check_max_pool_impl(impl)
    if impl != "auto":
        return f"impl={impl!r}"
    if all(d <= s for d, s in zip(dims, strides, strict=True)):
        return "windows that do not overlap (XLA's ops are as fast)"
    return pool_onednn.supports(x.shape, x.dtype, dims, strides, pads)


def check_max_pool_impl(impl: str) -> str:
    if impl not in MAX_POOL_IMPLS:
        raise ValueError(f"max_pool impl must be one of {MAX_POOL_IMPLS}, got {impl!r}.")
    return impl


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def xla_max_pool(x, dims: tuple[int, ...], strides: tuple[int, ...], pads) -> jax.Array:
    """Window maximum (padding counts as ``-inf``) whose gradient goes to the first maximum
    of each window in row-major window order, as XLA's and PyTorch's do; a window holding a
    NaN has a NaN maximum and its gradient goes to its last NaN, as PyTorch's does (CPU and
    CUDA kernels: ``val > maxval || isnan(val)``). XLA:CPU's select-and-scatter does not
    route it to the NaN: its ``ge`` selection flips on every comparison with a NaN, so the
    gradient lands on whichever element follows (measured in tests/nn/test_max_pool_grad.py).

    The backward visits the window offsets (9 for 3x3): a strided slice of the input and an
    equality mask against the output give each offset's share of the output gradient, and
    those are summed per stride phase on the output grid and interleaved once. XLA:CPU
    lowers the autodiff backward (select-and-scatter) to a variadic
    reduce-window over four int32 index tensors the size of the input plus a scatter, which
    took about a fifth of a ResNet-18 ImageNet-stem training step.
    """
    return lax.reduce_window(x, -jnp.inf, lax.max, dims, strides, pads)


def _max_pool_fwd(x, dims, strides, pads):
    y = xla_max_pool(x, dims, strides, pads)
    return y, (x, y)


def _max_pool_bwd(dims, strides, pads, residuals, g):
    x, y = residuals
    if isinstance(pads, str):
        pads = lax.padtype_to_pads(x.shape, dims, strides, pads)
    xp = lax.pad(x, jnp.asarray(-jnp.inf, x.dtype), [(lo, hi, 0) for lo, hi in pads])
    zero = jnp.zeros((), g.dtype)
    offsets = list(itertools.product(*(range(d) for d in dims)))

    def window_slice(offset):
        limit = [o + s * (n - 1) + 1 for o, s, n in zip(offset, strides, y.shape, strict=True)]
        return lax.slice(xp, offset, limit, strides)

    # Offset chosen per window: the first maximum; in a NaN window (its max is NaN, and NaN
    # equals nothing) the last NaN, found scanning backwards. The two never overlap.
    hits = {}
    taken = jnp.zeros(y.shape, bool)
    for offset in offsets:
        hits[offset] = (window_slice(offset) == y) & ~taken
        taken = taken | hits[offset]
    if jnp.issubdtype(x.dtype, jnp.inexact):
        later_nan = jnp.zeros(y.shape, bool)
        for offset in reversed(offsets):
            nan = jnp.isnan(window_slice(offset))
            hits[offset] = hits[offset] | (nan & ~later_nan)
            later_nan = later_nan | nan
    parts = {offset: jnp.where(hits[offset], g, zero) for offset in offsets}
    # Padded input index p = s*q + r receives from offsets k = r + s*j of window q - j: each
    # phase r is a sum of shifted output-sized arrays; the phases are interleaved once.
    phases_shape = [-(-n // s) for n, s in zip(xp.shape, strides, strict=True)]
    phases = []
    for phase in itertools.product(*(range(s) for s in strides)):
        acc = None
        for offset, part in parts.items():
            if any(k % s != r for k, s, r in zip(offset, strides, phase, strict=True)):
                continue
            shifts = [k // s for k, s in zip(offset, strides, strict=True)]
            cfg = [
                (j, q - n - j, 0) for j, q, n in zip(shifts, phases_shape, part.shape, strict=True)
            ]
            moved = lax.pad(part, zero, cfg)
            acc = moved if acc is None else acc + moved
        phases.append(jnp.zeros(phases_shape, g.dtype) if acc is None else acc)
    rank = x.ndim
    stacked = jnp.stack(phases).reshape((*strides, *phases_shape))
    # (s_0..s_r, Q_0..Q_r) -> (Q_0, s_0, Q_1, s_1, ...) -> (Q_0*s_0, ...)
    order = [a for d in range(rank) for a in (rank + d, d)]
    dxp = stacked.transpose(order).reshape(
        [q * s for q, s in zip(phases_shape, strides, strict=True)]
    )
    start = [lo for lo, _ in pads]
    return (lax.slice(dxp, start, [b + n for b, n in zip(start, x.shape, strict=True)]),)


xla_max_pool.defvjp(_max_pool_fwd, _max_pool_bwd)


class MaxPool(_Pool):
    """``torch.nn.MaxPool``: padding counts as ``-inf``. ``impl`` (``MAX_POOL_IMPLS``, a
    static attribute: ``nn.configure(model, max_pool=...)`` sets it) is ``max_pool``'s."""

    def __init__(self, kernel_size, strides=None, padding=0, *, impl: str = "auto", **kw):
        super().__init__(kernel_size, strides, padding, **kw)
        self.impl = check_max_pool_impl(impl)

    def __call__(self, x: jax.Array) -> jax.Array:
        dims, strides, pads = self._window_args(x)
        return max_pool(x, dims, strides, pads, self.impl)

    def may_call_onednn(self) -> bool:
        """Whether some input could run oneDNN's primitives (before any input is seen)."""
        return (
            self.impl == "auto"
            and self.layout == Layout.NHWC
            and any(k > s for k, s in zip(self.kernel_size, self.strides, strict=True))
        )


class AvgPool(_Pool):
    """``torch.nn.AvgPool`` with ``count_include_pad``; window sums accumulate in float32."""

    fp32_op = "AvgPool"

    def __init__(self, kernel_size, strides=None, padding=0, *, count_include_pad=True, **kw):
        super().__init__(kernel_size, strides, padding, **kw)
        self.count_include_pad = count_include_pad

    def __call__(self, x: jax.Array) -> jax.Array:
        dims, strides, pads = self._window_args(x)
        acc = self.policy.norm_dtype
        total = lax.reduce_window(x.astype(acc), 0.0, lax.add, dims, strides, pads)
        if self.count_include_pad and not isinstance(pads, str):
            y = total / jnp.asarray(np.prod(self.kernel_size), acc)
        else:
            # Count only the real elements under each window (SAME padding never counts pad).
            ones = jnp.ones([1 if a == 0 else s for a, s in enumerate(x.shape)], acc)
            count = lax.reduce_window(ones, 0.0, lax.add, dims, strides, pads)
            y = total / count
        return y.astype(self.policy.compute_dtype)


class GlobalAvgPool(LayoutModule):
    """Mean over the spatial axes, in float32; returns ``(N, C)`` or keeps the dims."""

    fp32_op = "GlobalAvgPool"

    def __init__(
        self,
        *,
        keepdims: bool = False,
        layout: Layout = Layout.NHWC,
        policy: Policy | None = None,
    ):
        self._set_layout_policy(layout, policy)
        self.keepdims = keepdims

    def __call__(self, x: jax.Array) -> jax.Array:
        self.layout.check_input(x.shape, None, "GlobalAvgPool")
        _check_nonempty(self.layout.spatial_shape(x.shape), "GlobalAvgPool")
        y = jnp.mean(
            x.astype(self.policy.norm_dtype), axis=self.layout.spatial_axes, keepdims=self.keepdims
        )
        return y.astype(self.policy.compute_dtype)


def _check_nonempty(sizes: tuple[int, ...], where: str) -> None:
    if 0 in sizes:
        raise ValueError(
            f"{where} received an empty spatial size {sizes}: the input image is too small "
            "for the model's down-sampling; use a larger input."
        )


def adaptive_pool_matrix(size: int, out: int) -> np.ndarray:
    """``(out, size)`` averaging weights of PyTorch's adaptive average pooling windows."""
    m = np.zeros((out, size), np.float32)
    for i in range(out):
        start, end = (i * size) // out, -(-((i + 1) * size) // out)
        m[i, start:end] = 1.0 / (end - start)
    return m


def apply_separable(x: jax.Array, layout: Layout, matrices: Sequence[np.ndarray], dtype):
    """Contract each spatial axis of ``x`` with its ``(out, in)`` matrix, in ``dtype``."""
    y = x.astype(dtype)
    for axis, m in zip(layout.spatial_axes, matrices, strict=True):
        y = jnp.moveaxis(
            jnp.tensordot(
                jnp.asarray(m, dtype), y, axes=((1,), (axis,)), precision=lax.Precision.HIGHEST
            ),
            0,
            axis,
        )
    return y


class AdaptiveAvgPool(LayoutModule):
    """``torch.nn.AdaptiveAvgPool``: output spatial size fixed, windows as PyTorch picks them."""

    fp32_op = "AvgPool"

    def __init__(
        self,
        output_size: int | Sequence[int],
        *,
        layout: Layout = Layout.NHWC,
        policy: Policy | None = None,
    ):
        self._set_layout_policy(layout, policy)
        self.output_size = normalize_tuple(output_size, self.layout.num_spatial, "output_size")

    def __call__(self, x: jax.Array) -> jax.Array:
        self.layout.check_input(x.shape, None, "AdaptiveAvgPool")
        sizes = self.layout.spatial_shape(x.shape)
        _check_nonempty(sizes, "AdaptiveAvgPool")
        if sizes == self.output_size:
            return x
        mats = [adaptive_pool_matrix(s, o) for s, o in zip(sizes, self.output_size, strict=True)]
        y = apply_separable(x, self.layout, mats, self.policy.norm_dtype)
        return y.astype(self.policy.compute_dtype)
