"""A strided conv's input gradient as one stride-1 conv per stride phase.

XLA differentiates a stride-``s`` conv into a conv over the output gradient dilated by ``s``
(``lhs_dilation``): of every ``s * s`` input positions it reads, all but one are inserted
zeros, and XLA:CPU multiplies them all. On ResNet-50's 56x56 stride-2 conv at batch 16 that
input gradient took more thread time than any other op of the training step.

Each input position ``i`` is reached only by the kernel taps ``t`` with
``t = (i + lo) mod s (mod s)``; grouping positions by that residue (their phase) gives, per
phase, an ordinary stride-1 correlation of the output gradient with the flipped sub-kernel
``w[p::s]``. The ``s * s`` phase results are interleaved back into ``dX``. Sums are the same
products as XLA's, without the zeros.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from layoutlab.nn.conv_algos.geometry import Geometry
from layoutlab.nn.conv_algos.native import xla_conv

__all__ = ["phase_input_grad"]


def _axis_plan(n: int, n_out: int, k: int, s: int, lo: int):
    """For one spatial axis: the phase range ``[q0, q1]`` and, per phase ``p``, the taps
    ``p, p + s, ...`` and the padding of the output gradient that makes phase ``p``'s
    correlation a VALID one over ``q0..q1``."""
    q0, q1 = lo // s, (n - 1 + lo) // s
    phases = []
    for p in range(s):
        taps = len(range(p, k, s))
        pads = (taps - 1 - q0, q1 - (n_out - 1))
        phases.append((p, taps, pads))
    return q0, q1, phases


def phase_input_grad(g, w, geom: Geometry, in_size, preferred):
    """``dX`` of an NHWC x HWIO conv from the NHWC output gradient ``g``."""
    (kh, kw), (sh, sw) = geom.kernel_size, geom.strides
    n, c_in = g.shape[0], w.shape[2]
    plans = [
        _axis_plan(size, out, k, s, lo)
        for size, out, k, s, (lo, _) in zip(
            in_size, g.shape[1:3], (kh, kw), (sh, sw), geom.padding, strict=True
        )
    ]
    (qh0, qh1, rows), (qw0, qw1, cols) = plans
    shape = (n, qh1 - qh0 + 1, qw1 - qw0 + 1, c_in)
    dtype = preferred or g.dtype
    zero = jnp.zeros((), g.dtype)
    grid = []
    for ph, taps_h, pads_h in rows:
        line = []
        for pw, taps_w, pads_w in cols:
            if taps_h == 0 or taps_w == 0:  # stride larger than the kernel: no tap lands here
                line.append(jnp.zeros(shape, dtype))
                continue
            gp = lax.pad(g, zero, ((0, 0, 0), (*pads_h, 0), (*pads_w, 0), (0, 0, 0)))
            sub = w[ph::sh, pw::sw][::-1, ::-1]  # (taps_h, taps_w, I, O), flipped
            line.append(
                xla_conv(
                    gp,
                    sub,
                    preferred,
                    window_strides=(1, 1),
                    padding="VALID",
                    dimension_numbers=("NHWC", "HWOI", "NHWC"),
                )
            )
        grid.append(jnp.stack(line, axis=3))  # (N, Qh, Qw, sw, I)
    full = jnp.stack(grid, axis=2)  # (N, Qh, sh, Qw, sw, I)
    full = full.reshape(n, shape[1] * sh, shape[2] * sw, c_in)
    # Interleaved row j is input row j - lo; row 0 sits at j = lo - s * q0 = lo mod s.
    top, left = geom.padding[0][0] % sh, geom.padding[1][0] % sw
    return full[:, top : top + in_size[0], left : left + in_size[1]]
