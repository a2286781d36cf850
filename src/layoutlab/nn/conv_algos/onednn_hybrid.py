"""``onednn_xla_dw``: oneDNN's forward and input gradient with XLA's own weight gradient.

oneDNN 3.2's weight-gradient primitive is its weak pass at small batch and spatial sizes,
and in bfloat16 it lost whole training steps that its forward and input gradient won
(docs/performance/measurements.md#conv-algorithms), so this keeps the two passes that
win and takes the third from XLA, as ``winograd4_xla_dw`` does for Winograd.

Both oneDNN passes come through ``onednn.onednn_core``: the forward as it is, the input
gradient as its VJP with respect to the activation only (the weight-gradient call that VJP
also traces has no user, and XLA removes it). So off CPU, and for operand pairings the
primitives do not take, every pass is XLA's conv, as with ``onednn``. The weight gradient is
``composed.weight_grad``'s ``native`` method: the cotangent cast to the operands' dtype (as
autocast does), accumulated in ``preferred_element_type`` when one is given.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from layoutlab.nn.conv_algos.composed import weight_grad
from layoutlab.nn.conv_algos.geometry import Geometry
from layoutlab.nn.conv_algos.onednn import onednn_core

__all__ = ["onednn_xla_dw_core"]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def onednn_xla_dw_core(x, w, geom: Geometry, preferred, layout: str = "NHWC"):
    """The registry core: NHWC (or NCHW) x HWIO conv, oneDNN forward and input gradient on
    CPU, XLA's weight gradient (and XLA's conv for every pass off CPU)."""
    return onednn_core(x, w, geom, preferred, layout)


def _fwd(x, w, geom, preferred, layout):
    return onednn_core(x, w, geom, preferred, layout), (x, w)


def _bwd(geom, preferred, layout, res, g):
    x, w = res
    # A half ``preferred`` is the layer's output dtype (``rounds_once``), not an accumulator:
    # the weight gradient still sums in float32 and is rounded once below.
    acc = preferred if preferred is not None else x.dtype
    if preferred is not None and jnp.dtype(preferred).itemsize < 4:
        acc = jnp.float32
    _, dx_of = jax.vjp(lambda a: onednn_core(a, w, geom, preferred, layout), x)
    (dx,) = dx_of(g)
    dw = weight_grad(g.astype(x.dtype), x, w, geom, "native", acc, layout)
    return dx.astype(x.dtype), dw.astype(w.dtype)


onednn_xla_dw_core.defvjp(_fwd, _bwd)
