"""Batch and group normalization over the layout's channel axis, with float32 statistics."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from layoutlab.layout import Layout
from layoutlab.nn.base import LayoutModule
from layoutlab.nn.dtypes import channel_shape
from layoutlab.precision import Policy


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def batch_norm_train(x, scale, bias, axes: tuple[int, ...], epsilon: float):
    """``(y, mean, var)``: ``x`` normalized with its own statistics over ``axes`` (biased
    variance), then scaled and shifted; ``mean``/``var`` are per channel.

    The backward is the closed form ``dx = scale * rstd / n * (n*dy - sum(dy) -
    xhat * sum(dy*xhat))``: two reductions and one elementwise pass, where autodiff of the
    two-pass variance runs six reductions and more passes over the activation. Measured on
    CPU: BatchNorm+ReLU forward+backward 22% faster on a ResNet-18 stage-1 activation, about
    1% of a whole ResNet-18 training step.
    """
    return _batch_norm_fwd(x, scale, bias, axes, epsilon)[0]


def _batch_norm_fwd(x, scale, bias, axes, epsilon):
    mean = jnp.mean(x, axes, keepdims=True)
    centered = x - mean
    var = jnp.mean(jnp.square(centered), axes, keepdims=True)
    rstd = lax.rsqrt(var + jnp.asarray(epsilon, x.dtype))
    shape = mean.shape
    y = centered * (rstd * scale.reshape(shape)) + bias.reshape(shape)
    return (y, mean.reshape(-1), var.reshape(-1)), (x, mean, rstd, scale)


def _batch_norm_bwd(axes, epsilon, residuals, cotangents):
    del epsilon
    x, mean, rstd, scale = residuals
    dy, dmean, dvar = cotangents
    n = math.prod(x.shape[a] for a in axes)
    shape = mean.shape
    centered = x - mean
    xhat = centered * rstd
    dbias = jnp.sum(dy, axes, keepdims=True)
    dscale = jnp.sum(dy * xhat, axes, keepdims=True)
    dx = (rstd * scale.reshape(shape) / n) * (n * dy - dbias - xhat * dscale)
    # The statistics' own cotangents (zero when, as in BatchNorm, they only feed the
    # running averages); per-channel vectors, so this costs no extra pass over x.
    dx = dx + (dmean.reshape(shape) + 2.0 * dvar.reshape(shape) * centered) / n
    return dx.astype(x.dtype), dscale.reshape(-1), dbias.reshape(-1)


batch_norm_train.defvjp(_batch_norm_fwd, _batch_norm_bwd)


class BatchNorm(LayoutModule):
    """``torch.nn.BatchNorm`` semantics: ``momentum`` weighs the new batch (default 0.1),
    normalization uses the biased batch variance, the running variance the unbiased one.
    """

    fp32_op = "BatchNorm"

    def __init__(
        self,
        num_features: int,
        *,
        momentum: float = 0.1,
        epsilon: float = 1e-5,
        use_running_average: bool = False,
        layout: Layout | str = Layout.NHWC,
        policy: Policy | str | None = None,
        rngs: nnx.Rngs | None = None,
    ):
        del rngs  # deterministic init; accepted so every layer has the same signature
        self._set_layout_policy(layout, policy)
        self.num_features = num_features
        self.momentum = momentum
        self.epsilon = epsilon
        self.use_running_average = use_running_average
        pdt = self.policy.param_dtype
        self.scale = nnx.Param(jnp.ones((num_features,), pdt))
        self.bias = nnx.Param(jnp.zeros((num_features,), pdt))
        # Running statistics are float32 under every policy: they are an average of many
        # batches and half precision would freeze them.
        self.mean = nnx.BatchStat(jnp.zeros((num_features,), jnp.float32))
        self.var = nnx.BatchStat(jnp.ones((num_features,), jnp.float32))

    def __call__(self, x: jax.Array, use_running_average: bool | None = None) -> jax.Array:
        self.layout.check_input(x.shape, self.num_features, f"BatchNorm({self.num_features})")
        if use_running_average is None:
            use_running_average = self.use_running_average
        ndt = self.policy.norm_dtype
        ca = self.layout.channel_axis
        axes = tuple(a for a in range(x.ndim) if a != ca)
        cshape = channel_shape(x.ndim, ca, self.num_features)
        xf = x.astype(ndt)
        scale, bias = self.scale[...].astype(ndt), self.bias[...].astype(ndt)
        if use_running_average:
            mean = self.mean[...].astype(ndt)
            var = self.var[...].astype(ndt)
            mul = lax.rsqrt(var + jnp.asarray(self.epsilon, ndt)) * scale
            y = (xf - mean.reshape(cshape)) * mul.reshape(cshape) + bias.reshape(cshape)
            return y.astype(self.policy.compute_dtype)
        y, mean, var = batch_norm_train(xf, scale, bias, axes, self.epsilon)
        count = x.size // self.num_features
        unbiased = var.astype(jnp.float32) * (count / max(count - 1, 1))
        m = self.momentum
        self.mean[...] = (1.0 - m) * self.mean[...] + m * lax.stop_gradient(
            mean.astype(jnp.float32)
        )
        self.var[...] = (1.0 - m) * self.var[...] + m * lax.stop_gradient(unbiased)
        return y.astype(self.policy.compute_dtype)


class GroupNorm(LayoutModule):
    """``torch.nn.GroupNorm``: statistics per example over each group of channels."""

    fp32_op = "GroupNorm"

    def __init__(
        self,
        num_groups: int,
        num_features: int,
        *,
        epsilon: float = 1e-5,
        layout: Layout | str = Layout.NHWC,
        policy: Policy | str | None = None,
        rngs: nnx.Rngs | None = None,
    ):
        del rngs
        if num_features % num_groups:
            raise ValueError(
                f"GroupNorm: num_features ({num_features}) must be divisible by num_groups "
                f"({num_groups})."
            )
        self._set_layout_policy(layout, policy)
        self.num_groups = num_groups
        self.num_features = num_features
        self.epsilon = epsilon
        pdt = self.policy.param_dtype
        self.scale = nnx.Param(jnp.ones((num_features,), pdt))
        self.bias = nnx.Param(jnp.zeros((num_features,), pdt))

    def __call__(self, x: jax.Array) -> jax.Array:
        self.layout.check_input(x.shape, self.num_features, f"GroupNorm({self.num_features})")
        ndt = self.policy.norm_dtype
        ca = self.layout.channel_axis
        g = self.num_groups
        grouped_shape = (*x.shape[:ca], g, self.num_features // g, *x.shape[ca + 1 :])
        xg = x.astype(ndt).reshape(grouped_shape)
        axes = tuple(a for a in range(xg.ndim) if a not in (0, ca))
        mean = jnp.mean(xg, axis=axes, keepdims=True)
        var = jnp.mean(jnp.square(xg - mean), axis=axes, keepdims=True)
        xn = ((xg - mean) * lax.rsqrt(var + jnp.asarray(self.epsilon, ndt))).reshape(x.shape)
        cshape = channel_shape(x.ndim, ca, self.num_features)
        y = xn * self.scale[...].astype(ndt).reshape(cshape) + self.bias[...].astype(ndt).reshape(
            cshape
        )
        return y.astype(self.policy.compute_dtype)
