"""One custom VJP for every combination of forward, input-gradient and weight-gradient method.

``Methods(forward, input_grad, weight_grad)`` names how each of the three convolutions of a
training step is computed:

- forward: ``native`` (XLA), ``gemm`` (im2col), ``winograd2`` / ``winograd4``;
- input gradient: ``native`` (XLA's transpose of its conv), ``col2im`` (GEMM + scatter),
  ``winograd2`` / ``winograd4`` (stride-1 3x3 only);
- weight gradient: ``native``, ``gemm`` (one GEMM per kernel offset) or ``winograd2`` /
  ``winograd4`` (F(3x3, m x m), stride-1 3x3 only).

Inputs are NHWC, kernels HWIO. The backward casts the cotangent to the input dtype (as
autocast does) and accumulates in ``preferred_element_type`` when one is given.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from layoutlab.nn.conv_algos import im2col, winograd
from layoutlab.nn.conv_algos.geometry import Geometry
from layoutlab.nn.conv_algos.native import native_conv


class Methods(NamedTuple):
    forward: str
    input_grad: str
    weight_grad: str


def _winograd_m(method: str) -> int:
    return int(method.removeprefix("winograd"))


def forward(x, w, geom: Geometry, method: str, preferred):
    if method == "native":
        return native_conv(x, w, geom, preferred)
    if method == "gemm":
        return im2col.im2col_forward(x, w, geom, preferred)
    if method.startswith("winograd"):
        return winograd.winograd_forward(x, w, geom.padding, _winograd_m(method), preferred)
    raise ValueError(f"Unknown forward method {method!r}; use native, gemm, winograd2/4.")


def _flipped(w):
    """The kernel of a stride-1 conv's input gradient: flipped, in/out channels swapped."""
    return jnp.transpose(w[::-1, ::-1], (0, 1, 3, 2))


def input_grad(g, x, w, geom: Geometry, method: str, acc):
    if method == "native":
        _, vjp = jax.vjp(lambda a: native_conv(a, w, geom, acc), x)
        return vjp(g.astype(acc))[0]
    if method == "col2im":
        return im2col.input_grad(g, w, geom, x.shape[1:3], acc)
    if method.startswith("winograd"):
        kh, kw = geom.kernel_size
        pads = tuple(
            (k - 1 - lo, k - 1 - hi) for k, (lo, hi) in zip((kh, kw), geom.padding, strict=True)
        )
        return winograd.winograd_forward(g, _flipped(w), pads, _winograd_m(method), acc)
    raise ValueError(f"Unknown input-gradient method {method!r}; use native, col2im, winograd.")


def weight_grad(g, x, w, geom: Geometry, method: str, acc):
    if method == "native":
        _, vjp = jax.vjp(lambda b: native_conv(x, b, geom, acc), w)
        return vjp(g.astype(acc))[0]
    if method == "gemm":
        return im2col.weight_grad(x, g, geom, w.shape, acc)
    if method.startswith("winograd"):
        return winograd.winograd_weight_grad(x, g, geom.padding, _winograd_m(method), acc)
    raise ValueError(
        f"Unknown weight-gradient method {method!r}; use native, gemm, winograd2/4."
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def composed_conv(x, w, geom: Geometry, methods: Methods, preferred):
    """NHWC x HWIO conv computed (and differentiated) by ``methods``."""
    return forward(x, w, geom, methods.forward, preferred)


def _fwd(x, w, geom, methods, preferred):
    return forward(x, w, geom, methods.forward, preferred), (x, w)


def _bwd(geom, methods, preferred, res, g):
    x, w = res
    acc = preferred if preferred is not None else x.dtype
    g = g.astype(x.dtype)
    dx = input_grad(g, x, w, geom, methods.input_grad, acc).astype(x.dtype)
    dw = weight_grad(g, x, w, geom, methods.weight_grad, acc).astype(w.dtype)
    return dx, dw


composed_conv.defvjp(_fwd, _bwd)


def core(methods: Methods):
    """A registry ``core`` running ``composed_conv`` with ``methods``."""

    def run(x, w, geom, preferred):
        return composed_conv(x, w, geom, methods, preferred)

    run.methods = methods
    return run
