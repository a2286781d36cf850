"""Batch and group normalization over the layout's channel axis, with float32 statistics."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax
from jax.custom_derivatives import SymbolicZero

from layoutlab.layout import Layout
from layoutlab.nn import norm_onednn
from layoutlab.nn.base import LayoutModule
from layoutlab.nn.dtypes import channel_shape
from layoutlab.precision import Policy

__all__ = [
    "AFFINE_MIN_ELEMENTS",
    "BATCH_NORM_IMPLS",
    "ONEDNN_NORM_DTYPES",
    "BatchNorm",
    "GroupNorm",
    "batch_norm_train",
    "batch_norm_train_affine",
    "batch_norm_relu",
    "batch_norm_train_centred",
    "check_batch_norm_impl",
]


# Below this many elements an activation takes the centred form, which small activations ran faster
# in (docs/performance/measurements.md#batchnorm-passes). Measured on CPU only; the arithmetic is
# the same on every backend.
AFFINE_MIN_ELEMENTS = 2**17


def batch_norm_train(x, scale, bias, axes: tuple[int, ...], epsilon: float):
    """``(y, mean, var)``: ``x`` normalized with its own statistics over ``axes`` (biased
    variance), then scaled and shifted; ``mean``/``var`` are per channel.

    Differentiable with a closed-form backward, ``dx = scale * rstd / n * (n*dy - sum(dy) -
    xhat * sum(dy*xhat))``: two reductions and one elementwise pass, where autodiff of the
    two-pass variance runs six reductions and more passes over the activation. Two
    arrangements of the same arithmetic, by size (``AFFINE_MIN_ELEMENTS``):
    ``batch_norm_train_affine`` for large activations, ``batch_norm_train_centred`` for
    small ones.
    """
    form = batch_norm_train_affine if x.size >= AFFINE_MIN_ELEMENTS else batch_norm_train_centred
    return form(x, scale, bias, axes, epsilon)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def batch_norm_train_centred(x, scale, bias, axes: tuple[int, ...], epsilon: float):
    """``batch_norm_train`` through ``x - mean`` and ``xhat``: the forward
    ``(x - mean) * (rstd * scale) + bias``, the backward the closed form over ``xhat``."""
    return _centred_fwd(x, scale, bias, axes, epsilon)[0]


def _centred_fwd(x, scale, bias, axes, epsilon):
    mean = jnp.mean(x, axes, keepdims=True)
    centered = x - mean
    var = jnp.mean(jnp.square(centered), axes, keepdims=True)
    rstd = lax.rsqrt(var + jnp.asarray(epsilon, x.dtype))
    shape = mean.shape
    y = centered * (rstd * scale.reshape(shape)) + bias.reshape(shape)
    return (y, mean.reshape(-1), var.reshape(-1)), (x, mean, rstd, scale)


def _centred_bwd(axes, epsilon, residuals, cotangents):
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


batch_norm_train_centred.defvjp(_centred_fwd, _centred_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def batch_norm_train_affine(x, scale, bias, axes: tuple[int, ...], epsilon: float):
    """``batch_norm_train`` written so that no elementwise result over the activation has
    two consumers.

    The forward is ``x * a + c`` with per-channel ``a = scale * rstd`` and
    ``c = bias - mean * a`` (PyTorch's CPU kernel applies the same form), the input gradient
    ``a * dy + b * x + c'``, and ``x - mean`` appears only inside the variance and the
    ``sum(dy * xhat)`` reductions. XLA:CPU's YNNPACK fusions cannot fuse a value into two
    consumers, so a shared ``x - mean`` or ``xhat`` (the centred form) is written out and read
    back in full; the barrier at the top of the backward keeps XLA from merging the
    backward's ``x - mean`` with the forward's into one such value, and the statistics'
    cotangents, zero whenever ``mean``/``var`` only feed running averages, are symbolic, so
    their terms vanish at trace time instead of costing a pass, which makes large
    activations' BatchNorm faster (docs/performance/measurements.md#batchnorm-passes).
    """
    return _affine_forward(x, scale, bias, axes, epsilon)[0]


def _affine_forward(x, scale, bias, axes, epsilon):
    mean = jnp.mean(x, axes, keepdims=True)
    # The variance of the centred values (two passes), not E[x^2] - mean^2, which cancels.
    var = jnp.mean(jnp.square(x - mean), axes, keepdims=True)
    rstd = lax.rsqrt(var + jnp.asarray(epsilon, x.dtype))
    shape = mean.shape
    a = rstd * scale.reshape(shape)
    y = x * a + (bias.reshape(shape) - mean * a)
    return (y, mean.reshape(-1), var.reshape(-1)), (x, mean, rstd, scale)


def _affine_fwd(x, scale, bias, axes, epsilon):
    # With symbolic_zeros the primals arrive wrapped (CustomVJPPrimal).
    return _affine_forward(x.value, scale.value, bias.value, axes, epsilon)


def _affine_bwd(axes, epsilon, residuals, cotangents):
    del epsilon
    x, mean, rstd, scale = lax.optimization_barrier(residuals)
    dy, dmean, dvar = cotangents
    n = math.prod(x.shape[a] for a in axes)
    shape = mean.shape
    if isinstance(dy, SymbolicZero):  # only the statistics reach the loss
        dy = jnp.zeros(x.shape, x.dtype)
    dbias = jnp.sum(dy, axes, keepdims=True)
    dscale = rstd * jnp.sum(dy * (x - mean), axes, keepdims=True)
    a = rstd * scale.reshape(shape)
    b = -a * rstd * dscale / n  # the coefficient of x - mean
    c = -a * dbias / n
    # The statistics' own cotangents: d mean/dx = 1/n, d var/dx = 2 (x - mean) / n.
    if not isinstance(dmean, SymbolicZero):
        c = c + dmean.reshape(shape) / n
    if not isinstance(dvar, SymbolicZero):
        b = b + 2.0 * dvar.reshape(shape) / n
    dx = a * dy + b * x + (c - b * mean)
    return dx.astype(x.dtype), dscale.reshape(-1), dbias.reshape(-1)


batch_norm_train_affine.defvjp(_affine_fwd, _affine_bwd, symbolic_zeros=True)


# How a BatchNorm in training mode computes: "auto" runs oneDNN's primitive on CPU where
# ``BatchNorm.onednn_reason`` finds nothing against it, "xla" always XLA's ops.
BATCH_NORM_IMPLS = ("auto", "xla")
# The activation dtypes "auto" hands to oneDNN. Its bfloat16 batch norm (forward and backward)
# ran several times faster than XLA's on ResNet-50's shapes; with its float32 one a ResNet-50
# step tied, and its float32 statistics are less exact
# (docs/performance/measurements.md#batchnorm-onednn).
ONEDNN_NORM_DTYPES = ("bfloat16",)


class BatchNorm(LayoutModule):
    """``torch.nn.BatchNorm`` semantics: ``momentum`` weighs the new batch (default 0.1),
    normalization uses the biased batch variance, the running variance the unbiased one.

    ``impl`` (one of ``BATCH_NORM_IMPLS``, a static attribute: ``nn.configure(model,
    batch_norm=...)`` sets it) says how training mode computes; ``"auto"`` runs oneDNN's
    primitive where ``onednn_reason`` returns None, XLA's ops elsewhere.
    """

    fp32_op = "BatchNorm"

    def __init__(
        self,
        num_features: int,
        *,
        momentum: float = 0.1,
        epsilon: float = 1e-5,
        use_running_average: bool = False,
        layout: Layout = Layout.NHWC,
        policy: Policy | None = None,
        impl: str = "auto",
        rngs: nnx.Rngs | None = None,
    ):
        del rngs  # deterministic init; accepted so every layer has the same signature
        self._set_layout_policy(layout, policy)
        self.impl = check_batch_norm_impl(impl)
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

    def __call__(
        self, x: jax.Array, use_running_average: bool | None = None, *, relu: bool = False
    ) -> jax.Array:
        """The normalized ``x``; ``relu``: with ReLU applied (inside oneDNN's call where it runs
        one; see ``batch_norm_relu``)."""
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
            return _relu(y.astype(self.policy.compute_dtype), relu)
        fused = self.onednn_reason(x) is None
        if fused:
            y, mean, var = norm_onednn.batch_norm_train_nhwc(x, scale, bias, self.epsilon, relu)
        else:
            y, mean, var = batch_norm_train(xf, scale, bias, axes, self.epsilon)
        count = x.size // self.num_features
        unbiased = var.astype(jnp.float32) * (count / max(count - 1, 1))
        m = self.momentum
        # ``set_value``, not ``[...] =``: flax's indexed set asks the tracer for its
        # sharding, and jax builds the message of that lookup's error from the jaxpr traced
        # so far, once per BatchNorm: ResNet-50's training step traced and lowered in 2.9 s
        # with it, 2.0 s without (flax 0.12.8, jax 0.10.2).
        self.mean.set_value(
            (1.0 - m) * self.mean[...] + m * lax.stop_gradient(mean.astype(jnp.float32))
        )
        self.var.set_value((1.0 - m) * self.var[...] + m * lax.stop_gradient(unbiased))
        return _relu(y.astype(self.policy.compute_dtype), relu and not fused)

    def may_call_onednn(self) -> bool:
        """Whether training mode may run oneDNN's primitive (its input, in the policy's compute
        dtype, of a dtype ``"auto"`` hands to oneDNN), before any input is seen."""
        return (
            self.impl == "auto"
            and self.layout == Layout.NHWC
            and self.policy.norm_dtype == np.dtype(np.float32)
            and self.policy.compute_dtype.name in ONEDNN_NORM_DTYPES
        )

    def onednn_reason(self, x) -> str | None:
        """None when training mode runs ``x`` (this layer's input, abstract is fine) on
        oneDNN's primitive, else why it runs XLA's ops."""
        if self.impl != "auto":
            return f"impl={self.impl!r}"
        if self.layout != Layout.NHWC:
            return f"layout {self.layout.value} (oneDNN batch norm here takes NHWC)"
        if self.policy.norm_dtype != np.dtype(np.float32):
            return f"statistics in {self.policy.norm_dtype.name} (oneDNN keeps float32)"
        if jnp.dtype(x.dtype).name not in ONEDNN_NORM_DTYPES:
            return f"{jnp.dtype(x.dtype).name} activations (oneDNN runs {ONEDNN_NORM_DTYPES})"
        return norm_onednn.supports(x.shape, x.dtype, False, self.epsilon)


def _relu(y, apply: bool):
    return jax.nn.relu(y) if apply else y


_JAX_RELU = jax.nn.relu
_BATCH_NORM_CALL = BatchNorm.__call__


def batch_norm_relu(bn: BatchNorm, x: jax.Array) -> jax.Array:
    """``jax.nn.relu(bn(x))``, the ReLU fused into oneDNN's call where ``bn`` runs one (a
    pass over the activation less each way). A tool that wraps layers' calls or
    ``jax.nn.relu`` to watch them (``compare``'s layer recorder and decision probe) sees the
    BatchNorm's output and the ReLU apart, as the model's caller applies it: the two are
    fused only while neither is wrapped."""
    if jax.nn.relu is _JAX_RELU and type(bn).__call__ is _BATCH_NORM_CALL:
        return bn(x, relu=True)
    return jax.nn.relu(bn(x))


def check_batch_norm_impl(impl: str) -> str:
    if impl not in BATCH_NORM_IMPLS:
        raise ValueError(f"BatchNorm impl must be one of {BATCH_NORM_IMPLS}, got {impl!r}.")
    return impl


class GroupNorm(LayoutModule):
    """``torch.nn.GroupNorm``: statistics per example over each group of channels."""

    fp32_op = "GroupNorm"

    def __init__(
        self,
        num_groups: int,
        num_features: int,
        *,
        epsilon: float = 1e-5,
        layout: Layout = Layout.NHWC,
        policy: Policy | None = None,
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
