"""2D max pooling of NHWC activations (float32 or bfloat16) as oneDNN primitives called through
XLA FFI custom calls (``native/onednn_pool.cc``): the forward writes oneDNN's workspace (the
chosen window offset of every output element), which the backward reads to route each output
gradient, so neither pass pads or widens the input.

Semantics are ``nn.pooling.max_pool``'s, bit for bit: oneDNN keeps the first maximum of a
window in row-major order as XLA's comparison does, and an input holding a NaN or an infinity
(where oneDNN's max, which skips NaN and starts from the lowest finite value, would differ) is
pooled by a plain loop in the handler with ``max_pool``'s rules, the backward following it
(``tests/nn/test_onednn_pool.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from layoutlab.nn.conv_algos import onednn
from layoutlab.nn.conv_algos.onednn_load import POOL_TARGETS, load, register_targets

__all__ = ["max_pool_nhwc", "pool_geometry", "pool_info", "supports"]

_DTYPES = {"float32": 0, "bfloat16": 1}
_info_cache: dict[tuple, tuple[str, int] | str] = {}


def pool_geometry(shape, dims, strides, pads):
    """``(kh, kw, sh, sw, plh, plw, prh, prw)`` of a 2D NHWC window, or the reason there is
    none (``max_pool``'s arguments: full-rank window dims, strides and padding)."""
    if len(shape) != 4:
        return f"rank {len(shape)} (oneDNN max pooling here is 2D NHWC)"
    if isinstance(pads, str):
        pads = lax.padtype_to_pads(shape, dims, strides, pads)
    pads = tuple(tuple(p) for p in pads)
    if dims[0] != 1 or dims[3] != 1 or strides[0] != 1 or strides[3] != 1:
        return "a window over the batch or channel axis"
    if pads[0] != (0, 0) or pads[3] != (0, 0):
        return "padding on the batch or channel axis"
    if any(p < 0 for pair in pads for p in pair):
        return "negative padding"
    (_, kh, kw, _), (_, sh, sw, _) = dims, strides
    if kh * kw > 255:
        return f"a {kh}x{kw} window (the workspace holds one byte per output)"
    return (kh, kw, sh, sw, pads[1][0], pads[2][0], pads[1][1], pads[2][1])


def _out_shape(shape, geom):
    kh, kw, sh, sw, plh, plw, prh, prw = geom
    n, h, w, c = shape
    return (n, (h + plh + prh - kh) // sh + 1, (w + plw + prw - kw) // sw + 1, c)


def pool_info(backward: bool, dtype: str, shape, geom):
    """``(oneDNN implementation, workspace bytes)`` of the primitive, or the error text.
    Creating the descriptor also caches the primitive the handler runs."""
    out = _out_shape(shape, geom)
    key = (int(backward), _DTYPES[dtype], *shape, out[1], out[2], *geom)
    if key not in _info_cache:
        module = load()
        if module is None or not hasattr(module, "pool_info"):
            return "the oneDNN extension has no max pooling"
        try:
            _info_cache[key] = tuple(module.pool_info(*key))
        except (RuntimeError, ValueError) as err:
            _info_cache[key] = str(err)
    return _info_cache[key]


def supports(shape, dtype, dims, strides, pads) -> str | None:
    """None when oneDNN runs this max pooling (forward and backward) with one of its
    optimized kernels, else why not."""
    dtype = jnp.dtype(dtype).name
    if dtype not in _DTYPES:
        return f"dtype {dtype} (oneDNN max pooling takes float32 and bfloat16)"
    geom = pool_geometry(shape, dims, strides, pads)
    if isinstance(geom, str):
        return geom
    if min(_out_shape(shape, geom)) <= 0 or 0 in shape:
        return "an empty input or output"
    if not onednn.available():
        return f"oneDNN unavailable: {onednn.unavailable_reason()}"
    for backward in (False, True):
        info = pool_info(backward, dtype, shape, geom)
        if isinstance(info, str):
            return info
        if "ref" in info[0]:
            return f"oneDNN would run its reference kernel {info[0]!r}"
    return None


def _attrs(geom):
    return dict(
        zip(("kh", "kw", "sh", "sw", "plh", "plw", "prh", "prw"), map(int, geom), strict=True)
    )


def _forward_call(x, geom):
    register_targets()
    info = pool_info(False, x.dtype.name, x.shape, geom)
    if isinstance(info, str):
        raise RuntimeError(f"oneDNN max pooling: {info}")
    y = jax.ShapeDtypeStruct(_out_shape(x.shape, geom), x.dtype)
    ws = jax.ShapeDtypeStruct((info[1] + 1,), jnp.uint8)  # + the plain-loop flag byte
    call = jax.ffi.ffi_call(POOL_TARGETS["pool_fwd"], (y, ws), vmap_method="sequential")
    return call(x, **{k: np.int64(v) for k, v in _attrs(geom).items()})


def _backward_call(dy, ws, x_shape, geom):
    register_targets()
    dx = jax.ShapeDtypeStruct(x_shape, dy.dtype)
    call = jax.ffi.ffi_call(POOL_TARGETS["pool_bwd"], dx, vmap_method="sequential")
    return call(dy, ws, **{k: np.int64(v) for k, v in _attrs(geom).items()})


def max_pool_nhwc(x, dims, strides, pads, xla_backward):
    """``nn.pooling.max_pool(x, dims, strides, pads)`` for an NHWC ``x`` that ``supports``
    accepts: oneDNN's primitives on CPU; on every other platform XLA's reduce-window and
    ``xla_backward(dims, strides, pads, (x, y), g)`` (``max_pool``'s own backward)."""
    geom = pool_geometry(x.shape, dims, strides, pads)
    if isinstance(geom, str):
        raise ValueError(f"oneDNN max pooling: {geom}")
    return _pool(x, geom, (dims, strides, pads, xla_backward))


def _xla_forward(x, static):
    dims, strides, pads, _ = static
    return lax.reduce_window(x, jnp.asarray(-jnp.inf, x.dtype), lax.max, dims, strides, pads)


def _pool(x, geom, static):
    return _pool_vjp(x, _Static(geom, static))


class _Static:
    """Hashable holder of the window and the XLA backward, a nondiff argument."""

    def __init__(self, geom, static):
        self.geom, self.static = geom, static
        dims, strides, pads, bwd = static
        pads = pads if isinstance(pads, str) else tuple(tuple(p) for p in pads)
        self._key = (geom, tuple(dims), tuple(strides), pads, bwd)

    def __hash__(self):
        return hash(self._key)

    def __eq__(self, other):
        return isinstance(other, _Static) and self._key == other._key


def _both_forward(x, st):
    ws_shape = (pool_info(False, x.dtype.name, x.shape, st.geom)[1] + 1,)

    def cpu(x):
        return tuple(_forward_call(x, st.geom))

    def default(x):
        return _xla_forward(x, st.static), jnp.zeros(ws_shape, jnp.uint8)

    return lax.platform_dependent(x, cpu=cpu, default=default)


def _pool_vjp_impl(x, st):
    return _both_forward(x, st)[0]


_pool_vjp = jax.custom_vjp(_pool_vjp_impl, nondiff_argnums=(1,))


def _fwd(x, st):
    y, ws = _both_forward(x, st)
    return y, (x, y, ws)


def _bwd(st, residuals, g):
    x, y, ws = residuals
    dims, strides, pads, xla_backward = st.static
    g = g.astype(x.dtype)

    def cpu(x, y, ws, g):
        del y
        return _backward_call(g, ws, x.shape, st.geom)

    def default(x, y, ws, g):
        del ws
        return xla_backward(dims, strides, pads, (x, y), g)[0]

    return (lax.platform_dependent(x, y, ws, g, cpu=cpu, default=default),)


_pool_vjp.defvjp(_fwd, _bwd)
