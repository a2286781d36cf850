"""Training-mode batch normalization (optionally followed by ReLU) as oneDNN primitives called
through XLA FFI custom calls (``native/onednn_norm.cc``).

Activations are NHWC in float32 or bfloat16; ``scale``, ``bias`` and the statistics float32.
oneDNN computes the statistics (mean, then the biased variance of the centred values) and the
normalization in float32 and rounds ``y`` and the input gradient to the activation's dtype
once, as ``batch_norm_train`` of the activation cast to float32 does. With ``relu`` the
forward also writes oneDNN's workspace, one bit per element, which the backward reads as the
ReLU's mask. ``batch_norm_train_nhwc`` is the pair as a differentiable function, which
``nn.norm.BatchNorm`` runs in training mode.

Determinism: oneDNN's CPU batch normalization splits its reductions over threads statically,
so a fixed thread count gives the same bits every call (``tests/nn/test_onednn_norm.py``).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import SymbolicZero

from layoutlab.nn.conv_algos import onednn
from layoutlab.nn.conv_algos.onednn_load import NORM_TARGETS, load, register_targets

__all__ = [
    "batch_norm_train_nhwc",
    "norm_info",
    "onednn_backward",
    "onednn_forward",
    "statistics_cotangent",
    "supports",
]

_DTYPES = {"float32": 0, "bfloat16": 1}
_info_cache: dict[tuple, tuple[str, int] | str] = {}


def norm_info(backward: bool, dtype: str, relu: bool, shape, epsilon: float):
    """``(oneDNN implementation, workspace bytes)`` of the primitive for an NHWC ``shape``,
    or the error text. Creating the descriptor also caches the primitive the handler runs."""
    n, h, w, c = shape
    key = (bool(backward), dtype, bool(relu), n, c, h, w, float(np.float32(epsilon)))
    if key not in _info_cache:
        module = load()
        if module is None or not hasattr(module, "norm_info"):
            return "the oneDNN extension has no batch normalization"
        try:
            args = (int(backward), _DTYPES[dtype], int(relu), n, c, h, w, key[-1])
            _info_cache[key] = tuple(module.norm_info(*args))
        except (RuntimeError, ValueError) as err:
            _info_cache[key] = str(err)
    return _info_cache[key]


def supports(shape, dtype, relu: bool, epsilon: float) -> str | None:
    """None when oneDNN runs this NHWC batch norm (forward and backward) with one of its
    optimized kernels, else why not."""
    dtype = jnp.dtype(dtype).name
    if dtype not in _DTYPES:
        return f"dtype {dtype} (oneDNN batch norm takes float32 and bfloat16)"
    if len(shape) != 4:
        return f"rank {len(shape)} (oneDNN batch norm here is 2D)"
    if not onednn.available():
        return f"oneDNN unavailable: {onednn.unavailable_reason()}"
    for backward in (False, True):
        info = norm_info(backward, dtype, relu, shape, epsilon)
        if isinstance(info, str):
            return info
        if "ref" in info[0]:
            return f"oneDNN would run its reference kernel {info[0]!r}"
    return None


def _workspace_shape(x, relu: bool, epsilon: float) -> tuple[int]:
    if not relu:
        return (1,)
    info = norm_info(False, x.dtype.name, True, x.shape, epsilon)
    if isinstance(info, str):
        raise RuntimeError(f"oneDNN batch norm: {info}")
    return (max(info[1], 1),)


def onednn_forward(x, scale, bias, epsilon: float, relu: bool = False):
    """``(y, mean, var, workspace)`` of NHWC ``x`` (see the module docstring)."""
    register_targets()
    stat = jax.ShapeDtypeStruct((x.shape[-1],), jnp.float32)
    ws = jax.ShapeDtypeStruct(_workspace_shape(x, relu, epsilon), jnp.uint8)
    call = jax.ffi.ffi_call(
        NORM_TARGETS["norm_fwd"],
        (jax.ShapeDtypeStruct(x.shape, x.dtype), stat, stat, ws),
        vmap_method="sequential",
    )
    f32 = jnp.float32
    return call(
        x, scale.astype(f32), bias.astype(f32), eps=np.float32(epsilon), relu=np.int64(relu)
    )


def onednn_backward(x, dy, scale, mean, var, workspace, epsilon: float, relu: bool = False):
    """``(dx, dscale, dbias)``: ``dx`` in ``x``'s dtype, the others float32."""
    register_targets()
    stat = jax.ShapeDtypeStruct((x.shape[-1],), jnp.float32)
    call = jax.ffi.ffi_call(
        NORM_TARGETS["norm_bwd"],
        (jax.ShapeDtypeStruct(x.shape, x.dtype), stat, stat),
        vmap_method="sequential",
    )
    return call(
        x,
        dy.astype(x.dtype),
        scale.astype(jnp.float32),
        mean,
        var,
        workspace,
        eps=np.float32(epsilon),
        relu=np.int64(relu),
    )


def statistics_cotangent(x, mean, dmean, dvar):
    """The input gradient's part from the statistics' own cotangents, float32 (None when both
    are symbolic zeros, as in ``BatchNorm``, whose statistics only feed the running averages):
    d mean/dx = 1/n, d var/dx = 2 (x - mean) / n."""
    n = math.prod(x.shape[:-1])
    shape = (1,) * (x.ndim - 1) + (x.shape[-1],)
    extra = None
    if not isinstance(dmean, SymbolicZero):
        extra = jnp.broadcast_to((dmean / n).reshape(shape), x.shape)
    if not isinstance(dvar, SymbolicZero):
        term = (2.0 / n) * dvar.reshape(shape) * (x.astype(jnp.float32) - mean.reshape(shape))
        extra = term if extra is None else extra + term
    return extra


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def batch_norm_train_nhwc(x, scale, bias, epsilon: float, relu: bool = False):
    """``(y, mean, var)`` as ``nn.norm.batch_norm_train`` gives them for an NHWC ``x`` (float32
    or bfloat16) over its batch and spatial axes, with float32 ``scale``, ``bias`` and
    statistics, ``y`` in ``x``'s dtype and, with ``relu``, ReLU applied to it: oneDNN's
    primitives on CPU, the same arithmetic in float32 XLA ops on every other platform. The
    extension must be available (``supports``)."""
    return _nhwc_forward(x, scale, bias, epsilon, relu)[0]


def _nhwc_forward(x, scale, bias, epsilon, relu):
    ws_shape = _workspace_shape(x, relu, epsilon)

    def cpu(x, scale, bias):
        return onednn_forward(x, scale, bias, epsilon, relu)

    def default(x, scale, bias):
        pre, mean, var = _xla_forward(x, scale, bias, epsilon)
        y = jnp.maximum(pre, 0.0) if relu else pre
        return y.astype(x.dtype), mean, var, jnp.zeros(ws_shape, jnp.uint8)

    y, mean, var, ws = lax.platform_dependent(x, scale, bias, cpu=cpu, default=default)
    return (y, mean, var), (x, scale, bias, mean, var, ws)


def _xla_forward(x, scale, bias, epsilon):
    """float32 ``(pre-activation, mean, var)`` (the variance of the centred values)."""
    xf = x.astype(jnp.float32)
    shape = (1,) * (x.ndim - 1) + (x.shape[-1],)
    mean = jnp.mean(xf, (0, 1, 2), keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), (0, 1, 2), keepdims=True)
    a = lax.rsqrt(var + jnp.asarray(epsilon, jnp.float32)) * scale.reshape(shape)
    pre = xf * a + (bias.reshape(shape) - mean * a)
    return pre, mean.reshape(-1), var.reshape(-1)


def _xla_backward(x, dy, scale, bias, mean, var, epsilon, relu):
    """``(dx, dscale, dbias)`` in XLA ops (off CPU), ``dx`` in ``x``'s dtype."""
    xf, dyf = x.astype(jnp.float32), dy.astype(jnp.float32)
    if relu:  # the mask from the pre-activation, recomputed
        pre = _xla_forward(x, scale, bias, epsilon)[0]
        dyf = jnp.where(pre > 0, dyf, 0.0)
    n = math.prod(x.shape[:-1])
    shape = (1, 1, 1, x.shape[-1])
    mean, scale = mean.reshape(shape), scale.reshape(shape)
    rstd = lax.rsqrt(var.reshape(shape) + jnp.asarray(epsilon, jnp.float32))
    dbias = jnp.sum(dyf, (0, 1, 2), keepdims=True)
    dscale = rstd * jnp.sum(dyf * (xf - mean), (0, 1, 2), keepdims=True)
    a = rstd * scale
    dx = a * dyf - (a * rstd * dscale / n) * (xf - mean) - a * dbias / n
    return dx.astype(x.dtype), dscale.reshape(-1), dbias.reshape(-1)


def _nhwc_fwd(x, scale, bias, epsilon, relu):
    return _nhwc_forward(x.value, scale.value, bias.value, epsilon, relu)


def _nhwc_bwd(epsilon, relu, residuals, cotangents):
    x, scale, bias, mean, var, ws = residuals
    dy, dmean, dvar = cotangents
    if isinstance(dy, SymbolicZero):
        dy = jnp.zeros(x.shape, x.dtype)
    dy = dy.astype(x.dtype)

    def cpu(x, dy, scale, bias, mean, var, ws):
        return onednn_backward(x, dy, scale, mean, var, ws, epsilon, relu)

    def default(x, dy, scale, bias, mean, var, ws):
        del ws
        return _xla_backward(x, dy, scale, bias, mean, var, epsilon, relu)

    operands = (x, dy, scale, bias, mean, var, ws)
    dx, dscale, dbias = lax.platform_dependent(*operands, cpu=cpu, default=default)
    extra = statistics_cotangent(x, mean, dmean, dvar)
    if extra is not None:
        dx = (dx.astype(jnp.float32) + extra).astype(x.dtype)
    return dx, dscale.astype(scale.dtype), dbias.astype(bias.dtype)


batch_norm_train_nhwc.defvjp(_nhwc_fwd, _nhwc_bwd, symbolic_zeros=True)
