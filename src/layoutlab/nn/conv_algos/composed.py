"""One custom VJP for every combination of forward, input-gradient and weight-gradient method.

``Methods(forward, input_grad, weight_grad)`` names how each of the three convolutions of a
training step is computed:

- forward: ``native`` (XLA), ``gemm`` (im2col), ``winograd2`` / ``winograd4``;
- input gradient: ``native`` (XLA's transpose of its conv), ``col2im`` (GEMM + scatter),
  ``phase`` (one stride-1 conv per stride phase, ``conv_algos.phase``), ``winograd2`` /
  ``winograd4`` (stride-1 3x3 only);
- weight gradient: ``native``, ``gemm`` (one GEMM per kernel offset) or ``winograd2`` /
  ``winograd4`` (F(3x3, m x m), stride-1 3x3 only).

Kernels are HWIO; activations NHWC or NCHW (``layout``). ``native`` and Winograd read and
write either layout directly: Winograd's tiling permutes every element anyway, so the
channel move of an NCHW activation happens inside the fusions that write the tiles rather
than as a transpose of its own (docs/performance/measurements.md#conv-algorithms). The GEMM methods
compute in NHWC, and NCHW tensors are transposed in and out around them. The backward casts
the cotangent to the input dtype (as autocast does) and accumulates in
``preferred_element_type`` when one is given.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

import layoutlab.nn.conv_algos.im2col as im2col
import layoutlab.nn.conv_algos.phase as phase
import layoutlab.nn.conv_algos.winograd as winograd
from layoutlab.nn.conv_algos.geometry import Geometry
from layoutlab.nn.conv_algos.native import native_conv

__all__ = ["Methods", "composed_conv", "core", "forward", "input_grad", "weight_grad"]


class Methods(NamedTuple):
    forward: str
    input_grad: str
    weight_grad: str


def _winograd_m(method: str) -> int:
    return int(method.removeprefix("winograd"))


def _to_nhwc(t, layout: str):
    return t if layout == "NHWC" else jnp.transpose(t, (0, 2, 3, 1))


def _from_nhwc(t, layout: str):
    return t if layout == "NHWC" else jnp.transpose(t, (0, 3, 1, 2))


def _native(geom: Geometry, preferred, layout: str):
    """XLA's conv of a ``layout`` activation and an HWIO kernel: ``(x, w) -> y``."""
    return lambda a, b: native_conv(a, b, geom, preferred, (layout, "HWIO", layout))


def forward(x, w, geom: Geometry, method: str, preferred, layout: str = "NHWC"):
    if method == "native":
        return _native(geom, preferred, layout)(x, w)
    if method == "gemm":
        y = im2col.im2col_forward(_to_nhwc(x, layout), w, geom, preferred)
        return _from_nhwc(y, layout)
    if method.startswith("winograd"):
        m = _winograd_m(method)
        return winograd.winograd_forward(x, w, geom.padding, m, preferred, layout)
    raise ValueError(f"Unknown forward method {method!r}; use native, gemm, winograd2/4.")


def _flipped(w):
    """The kernel of a stride-1 conv's input gradient: flipped, in/out channels swapped."""
    return jnp.transpose(w[::-1, ::-1], (0, 1, 3, 2))


def input_grad(g, x, w, geom: Geometry, method: str, acc, layout: str = "NHWC"):
    if method == "native":
        _, vjp = jax.vjp(lambda a: _native(geom, acc, layout)(a, w), x)
        return vjp(g.astype(acc))[0]
    if method == "col2im":
        in_size = _to_nhwc(x, layout).shape[1:3]
        dx = im2col.input_grad(_to_nhwc(g, layout), w, geom, in_size, acc)
        return _from_nhwc(dx, layout)
    if method == "phase":
        in_size = _to_nhwc(x, layout).shape[1:3]
        dx = phase.phase_input_grad(_to_nhwc(g, layout), w, geom, in_size, acc)
        return _from_nhwc(dx, layout)
    if method.startswith("winograd"):
        kh, kw = geom.kernel_size
        pads = tuple(
            (k - 1 - lo, k - 1 - hi) for k, (lo, hi) in zip((kh, kw), geom.padding, strict=True)
        )
        m = _winograd_m(method)
        return winograd.winograd_forward(g, _flipped(w), pads, m, acc, layout)
    raise ValueError(
        f"Unknown input-gradient method {method!r}; use native, col2im, phase, winograd."
    )


def weight_grad(g, x, w, geom: Geometry, method: str, acc, layout: str = "NHWC"):
    if method == "native":
        _, vjp = jax.vjp(lambda b: _native(geom, acc, layout)(x, b), w)
        return vjp(g.astype(acc))[0]
    if method == "gemm":
        return im2col.weight_grad(_to_nhwc(x, layout), _to_nhwc(g, layout), geom, w.shape, acc)
    if method.startswith("winograd"):
        m = _winograd_m(method)
        return winograd.winograd_weight_grad(x, g, geom.padding, m, acc, layout)
    raise ValueError(f"Unknown weight-gradient method {method!r}; use native, gemm, winograd2/4.")


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def composed_conv(x, w, geom: Geometry, methods: Methods, preferred, layout: str = "NHWC"):
    """``layout`` (NHWC or NCHW) x HWIO conv computed (and differentiated) by ``methods``."""
    return forward(x, w, geom, methods.forward, preferred, layout)


def _fwd(x, w, geom, methods, preferred, layout):
    return forward(x, w, geom, methods.forward, preferred, layout), (x, w)


def _bwd(geom, methods, preferred, layout, res, g):
    x, w = res
    acc = preferred if preferred is not None else x.dtype
    g = g.astype(x.dtype)
    dx = input_grad(g, x, w, geom, methods.input_grad, acc, layout).astype(x.dtype)
    dw = weight_grad(g, x, w, geom, methods.weight_grad, acc, layout).astype(w.dtype)
    return dx, dw


composed_conv.defvjp(_fwd, _bwd)


def core(methods: Methods):
    """A registry ``core`` running ``composed_conv`` with ``methods``. It also takes
    ``layout="NCHW"`` (``run.layouts``), so ``conv2d`` hands it NCHW models' activations as
    they are."""

    def run(x, w, geom, preferred, layout="NHWC"):
        return composed_conv(x, w, geom, methods, preferred, layout)

    run.methods = methods
    run.layouts = ("NHWC", "NCHW")
    return run
