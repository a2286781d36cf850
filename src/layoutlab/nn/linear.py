"""Dense, Flatten with a fixed feature order, and Dropout."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from layoutlab.layout import Layout, channels_first, channels_last, to_layout
from layoutlab.nn.base import LayoutModule
from layoutlab.nn.dtypes import accumulation_dtype
from layoutlab.nn.init import flat_uniform
from layoutlab.precision import Policy, get_policy

Dropout = nnx.Dropout


class Dense(nnx.Module):
    """``y = x @ kernel + bias`` with ``kernel`` of shape ``(in, out)``."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        use_bias: bool = True,
        policy: Policy | str | None = None,
        kernel_init=None,
        rngs: nnx.Rngs,
    ):
        self.policy = get_policy(policy)
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
        y = jnp.matmul(
            x.astype(dtype),
            self.kernel[...].astype(dtype),
            preferred_element_type=accumulation_dtype(self.policy),
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

    def __init__(self, *, order: str = "CHW", layout: Layout | str = Layout.NHWC, policy=None):
        if order not in ("CHW", "HWC"):
            raise ValueError(f"Flatten order must be 'CHW' or 'HWC', got {order!r}.")
        self._set_layout_policy(layout, policy)
        self.order = order

    def __call__(self, x: jax.Array) -> jax.Array:
        self.layout.check_input(x.shape, None, "Flatten")
        n = self.layout.num_spatial
        want = channels_first(n) if self.order == "CHW" else channels_last(n)
        return to_layout(x, self.layout, want).reshape(x.shape[0], -1)
