"""Training-mode batch normalization (optionally followed by ReLU) as oneDNN primitives called
through XLA FFI custom calls (``native/onednn_norm.cc``).

Activations are NHWC in float32 or bfloat16; ``scale``, ``bias`` and the statistics float32.
oneDNN computes the statistics (mean, then the biased variance of the centred values) and the
normalization in float32 and rounds ``y`` and the input gradient to the activation's dtype
once, as ``batch_norm_train`` of the activation cast to float32 does. With ``relu`` the
forward also writes oneDNN's workspace, one bit per element, which the backward reads as the
ReLU's mask. ``nn.norm.BatchNorm`` runs ``onednn_forward``/``onednn_backward`` inside its own
custom VJP (``batch_norm_train_nhwc``); ``onednn_batch_norm`` is the same pair as a
differentiable function with the fused ReLU.

Determinism: oneDNN's CPU batch normalization splits its reductions over threads statically,
so a fixed thread count gives the same bits every call (``tests/nn/test_onednn_norm.py``).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from layoutlab.nn.conv_algos import onednn
from layoutlab.nn.conv_algos.onednn_load import TARGETS, load, register_targets

__all__ = [
    "norm_info",
    "onednn_backward",
    "onednn_batch_norm",
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
        TARGETS["norm_fwd"],
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
        TARGETS["norm_bwd"],
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
def onednn_batch_norm(x, scale, bias, epsilon: float, relu: bool = False):
    """``(y, mean, var)`` of an NHWC ``x`` on CPU, ``relu`` applied to ``y``."""
    y, mean, var, _ = onednn_forward(x, scale, bias, epsilon, relu)
    return y, mean, var


def _fwd(x, scale, bias, epsilon, relu):
    x, scale, bias = x.value, scale.value, bias.value
    y, mean, var, ws = onednn_forward(x, scale, bias, epsilon, relu)
    return (y, mean, var), (x, scale, mean, var, ws)


def _bwd(epsilon, relu, residuals, cotangents):
    x, scale, mean, var, ws = residuals
    dy, dmean, dvar = cotangents
    if isinstance(dy, SymbolicZero):
        dy = jnp.zeros(x.shape, x.dtype)
    dx, dscale, dbias = onednn_backward(x, dy, scale, mean, var, ws, epsilon, relu)
    extra = statistics_cotangent(x, mean, dmean, dvar)
    if extra is not None:
        dx = (dx.astype(jnp.float32) + extra).astype(x.dtype)
    return dx, dscale.astype(scale.dtype), dbias.astype(scale.dtype)


onednn_batch_norm.defvjp(_fwd, _bwd, symbolic_zeros=True)
