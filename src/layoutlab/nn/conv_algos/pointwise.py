"""1x1 convs as a plain dot: a strided slice of the input, then ``x @ W``.

JAX differentiates it directly: the slice's transpose is a ``pad`` with interior padding
(a stride-2 1x1 conv's input gradient without ``lhs_dilation``) and both gradients are dots.
"""

from __future__ import annotations

from jax import lax

from layoutlab.nn.conv_algos.algorithm import plain_2d
from layoutlab.nn.conv_algos.geometry import ConvSpec, Geometry
from layoutlab.nn.conv_algos.im2col import pad_input

__all__ = ["pointwise_conv", "supports"]


def supports(spec: ConvSpec) -> str | None:
    reason = plain_2d(spec)
    if reason:
        return reason
    if spec.geometry.kernel_size != (1, 1):
        return f"kernel {spec.geometry.kernel_size} (pointwise is for 1x1 kernels)"
    return None


def pointwise_conv(x, w, geom: Geometry, preferred):
    xp = pad_input(x, geom.padding) if any(p != (0, 0) for p in geom.padding) else x
    ho, wo = geom.out_size(x.shape[1:3])
    sh, sw = geom.strides
    if (sh, sw) != (1, 1) or xp.shape[1:3] != (ho, wo):
        xp = lax.slice(
            xp,
            (0, 0, 0, 0),
            (xp.shape[0], (ho - 1) * sh + 1, (wo - 1) * sw + 1, xp.shape[3]),
            (1, sh, sw, 1),
        )
    w2 = w.reshape(w.shape[-2], w.shape[-1])
    return lax.dot_general(xp, w2, (((3,), (0,)), ((), ())), preferred_element_type=preferred)
