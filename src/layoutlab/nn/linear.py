"""Dense, Flatten with a fixed feature order, and Dropout."""

from __future__ import annotations

import functools
import math

import jax
from flax import nnx
from jax import lax

from layoutlab.layout import Layout, channels_first, channels_last, to_layout
from layoutlab.nn.base import LayoutModule, layer_policy
from layoutlab.nn.dtypes import accumulation_dtype
from layoutlab.nn.init import flat_uniform
from layoutlab.precision import Policy

__all__ = ["Dense", "Dropout", "Flatten", "dense_matmul"]


Dropout = nnx.Dropout


def _matmul(x, kernel, preferred):
    return lax.dot_general(
        x, kernel, (((x.ndim - 1,), (0,)), ((), ())), preferred_element_type=preferred
    )


def dense_matmul(x: jax.Array, kernel: jax.Array, preferred=None) -> jax.Array:
    """``x @ kernel`` (``kernel``: ``(in, out)``). With one row (a batch-1 step) its input
    gradient contracts the kernel over its minor axis, ``kernel . dy``: JAX's own rule
    writes ``dy @ kernel.T``, which XLA:CPU turns, for one row, into a multiply and a
    reduction down the kernel's major axis, many times slower; from 8 rows both forms ran
    even, so those keep JAX's rule (docs/performance/measurements.md#dense-layer-at-batch-1)."""
    if math.prod(x.shape[:-1]) == 1:
        return _one_row_matmul(x, kernel, preferred)
    return _matmul(x, kernel, preferred)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _one_row_matmul(x, kernel, preferred):
    return _matmul(x, kernel, preferred)


def _one_row_fwd(x, kernel, preferred):
    return _matmul(x, kernel, preferred), (x, kernel)


def _one_row_bwd(preferred, residuals, dy):
    x, kernel = residuals
    dx = lax.dot_general(
        kernel, dy, (((1,), (dy.ndim - 1,)), ((), ())), preferred_element_type=preferred
    )
    batch = tuple(range(x.ndim - 1))
    dk = lax.dot_general(x, dy, ((batch, batch), ((), ())), preferred_element_type=preferred)
    # dx is (in, 1, ..., 1): one row, so the reshape is free.
    return dx.reshape(x.shape).astype(x.dtype), dk.astype(kernel.dtype)


_one_row_matmul.defvjp(_one_row_fwd, _one_row_bwd)


class Dense(nnx.Module):
    """``y = x @ kernel + bias`` with ``kernel`` of shape ``(in, out)``."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        use_bias: bool = True,
        policy: Policy | None = None,
        kernel_init=None,
        rngs: nnx.Rngs,
    ):
        self.policy = layer_policy(policy, "Dense")
        self.in_features = in_features
        self.out_features = out_features
        dtype = self.policy.param_dtype
        # PyTorch's Linear default: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias.
        bound = 1.0 / math.sqrt(in_features)
        init = kernel_init or (lambda k, s, d: flat_uniform(k, s, d, -bound, bound))
        self.kernel = nnx.Param(init(rngs.params(), (in_features, out_features), dtype))
        self.bias = (
            nnx.Param(jax.random.uniform(rngs.params(), (out_features,), dtype, -bound, bound))
            if use_bias
            else None
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"Dense({self.in_features}->{self.out_features}) expects inputs with "
                f"{self.in_features} features on the last axis, got shape {tuple(x.shape)}."
            )
        dtype = self.policy.compute_dtype
        y = dense_matmul(
            x.astype(dtype), self.kernel[...].astype(dtype), accumulation_dtype(self.policy)
        )
        if self.bias is not None:
            bias = self.bias[...].astype(y.dtype)
            y = y + bias.reshape((1,) * (y.ndim - 1) + bias.shape)
        return y.astype(dtype)


class Flatten(LayoutModule):
    """Flatten all but the batch axis in a fixed feature order, whatever the layout.

    ``order="CHW"`` (default) is PyTorch's ``flatten`` of an NCHW tensor, so a Dense after
    it sees the same features in both layouts and torchvision classifier weights apply.
    ``order="HWC"`` is the channels-last order, free of transposes for NHWC models.
    """

    def __init__(
        self, *, order: str = "CHW", layout: Layout = Layout.NHWC, policy: Policy | None = None
    ):
        if order not in ("CHW", "HWC"):
            raise ValueError(f"Flatten order must be 'CHW' or 'HWC', got {order!r}.")
        self._set_layout_policy(layout, policy)
        self.order = order

    def __call__(self, x: jax.Array) -> jax.Array:
        self.layout.check_input(x.shape, None, "Flatten")
        n = self.layout.num_spatial
        want = channels_first(n) if self.order == "CHW" else channels_last(n)
        return to_layout(x, self.layout, want).reshape(x.shape[0], -1)
