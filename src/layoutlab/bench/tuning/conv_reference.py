"""Numerics of a conv algorithm candidate: random inputs for a ``ConvSpec``, float64 NumPy
references for the output and both gradients, and the tolerance a candidate must meet.

Tolerance (``conv_tolerance``): an output summing ``K`` products is checked with
``|a - e| <= rtol * (|e| + max|e|)``, ``rtol = u(dtype) + u(float32) * sqrt(K)``, where
``u`` is the dtype's default relative tolerance (float32 1.3e-6, bfloat16 1.6e-2): one
term for rounding the operands to the compute dtype, one for float32 accumulation, whose
rounding errors add like a random walk over the ``K`` terms. ``K`` is ``kh*kw*Cin`` for the
output, ``kh*kw*Cout`` for the input gradient and ``N*Ho*Wo`` for the weight gradient. The
absolute part scales with the largest reference value because near-zero outputs of a long
sum carry the rounding error of its large terms. Every algorithm meets the same bar
(Winograd included); it rejects wrong results (a bad tile, a flipped kernel), and Winograd
F(4x4,3x3) in bfloat16, whose transforms magnify the operand rounding about 20x.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from layoutlab.compare import Tolerance, compare, default_tolerance
from layoutlab.compare import numpy_ref as nr
from layoutlab.nn.conv_algos import ConvSpec, Geometry

__all__ = [
    "candidate_errors",
    "conv_shapes",
    "conv_tolerance",
    "effective_compute_dtype",
    "reference_conv",
    "spec_inputs",
]

# jax_default_matmul_precision values that keep float32 convs and matmuls in float32 on GPU.
_FULL_F32 = {"float32", "highest", "F32_F32_F32"}


def effective_compute_dtype(dtype, platform: str | None) -> np.dtype:
    """The dtype whose rounding a float32 conv really has: on GPUs with TensorFloat32 (the
    default matmul precision on Ampere and later) float32 convs and matmuls keep float16's
    10 mantissa bits, so they are judged as float16 unless full float32 is asked for."""
    dtype = np.dtype(dtype)
    tf32 = platform == "gpu" and jax.config.jax_default_matmul_precision not in _FULL_F32
    return np.dtype(np.float16) if dtype == np.float32 and tf32 else dtype


def conv_tolerance(dtype, reduction: int) -> Tolerance:
    """Tolerance for a conv output summing ``reduction`` products computed in ``dtype``
    with float32 accumulation; apply with ``atol = rtol * max|expected|`` (see module doc).
    """
    if reduction < 1:
        raise ValueError(f"reduction must be >= 1, got {reduction}.")
    unit = default_tolerance(dtype).rtol
    accumulation = default_tolerance(np.float32).rtol * math.sqrt(reduction)
    rtol = unit + accumulation
    return Tolerance(rtol, rtol)


def _reductions(spec: ConvSpec) -> dict[str, int]:
    kh, kw = spec.geometry.kernel_size
    ho, wo = spec.out_size
    groups = spec.geometry.groups
    return {
        "y": spec.reduction,
        "dx": kh * kw * spec.out_features // groups,
        "dw": spec.batch * ho * wo,
    }


def conv_shapes(spec: ConvSpec) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Input, kernel (layout's default order) and output shapes of ``spec``."""
    n, (h, w), c, o = spec.batch, spec.in_size, spec.in_features, spec.out_features
    kh, kw = spec.geometry.kernel_size
    ho, wo = spec.out_size
    cg = c // spec.geometry.groups
    if spec.layout == "NHWC":
        return (n, h, w, c), (kh, kw, cg, o), (n, ho, wo, o)
    return (n, c, h, w), (o, cg, kh, kw), (n, o, ho, wo)


def spec_inputs(spec: ConvSpec, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random float32 ``(x, kernel, dy)`` for ``spec``: unit-normal input and output
    gradient, kernel with variance ``1 / fan_in`` so outputs are of order one."""
    xs, ws, ys = conv_shapes(spec)
    rng = np.random.default_rng(seed)
    fan_in = math.prod(ws) // spec.out_features
    x = rng.standard_normal(xs, dtype=np.float32)
    w = (rng.standard_normal(ws) / math.sqrt(fan_in)).astype(np.float32)
    dy = rng.standard_normal(ys, dtype=np.float32)
    return x, w, dy


def _to_cf(x: np.ndarray, layout: str) -> np.ndarray:
    return np.transpose(x, (0, 3, 1, 2)) if layout == "NHWC" else x


def _from_cf(x: np.ndarray, layout: str) -> np.ndarray:
    return np.transpose(x, (0, 2, 3, 1)) if layout == "NHWC" else x


def reference_conv(
    x: np.ndarray, w: np.ndarray, dy: np.ndarray, spec: ConvSpec
) -> dict[str, np.ndarray]:
    """Float64 ``{"y", "dx", "dw"}`` of ``spec``'s conv from NumPy alone, in its layout.

    ``dx`` is the transposed conv of ``dy``; ``dw`` is a conv of the (padded) input, batch
    and channels swapped, with ``dy`` as the kernel dilated by the stride. A grouped conv
    is its groups' ungrouped convs side by side (channels, kernels and ``dy`` split alike).
    """
    g: Geometry = spec.geometry
    if g.dilation != (1, 1):
        raise ValueError(
            "reference_conv covers undilated convs (the ones the custom algorithms handle); "
            f"got dilation={g.dilation}."
        )
    xc = _to_cf(np.asarray(x, np.float64), spec.layout)
    dyc = _to_cf(np.asarray(dy, np.float64), spec.layout)
    wk = np.asarray(w, np.float64)
    oihw = np.transpose(wk, (3, 2, 0, 1)) if spec.layout == "NHWC" else wk
    parts = [
        _ungrouped_reference(xs, ws, dys, g)
        for xs, ws, dys in zip(
            np.split(xc, g.groups, axis=1),
            np.split(oihw, g.groups, axis=0),
            np.split(dyc, g.groups, axis=1),
            strict=True,
        )
    ]
    y, dx, dw_oihw = (
        np.concatenate([part[k] for part in parts], axis=axis) for k, axis in enumerate((1, 1, 0))
    )
    dw = np.transpose(dw_oihw, (2, 3, 1, 0)) if spec.layout == "NHWC" else dw_oihw
    return {"y": _from_cf(y, spec.layout), "dx": _from_cf(dx, spec.layout), "dw": dw}


def _ungrouped_reference(xc, oihw, dyc, g: Geometry):
    """``(y, dx, dw)`` of one ungrouped conv, NCHW and OIHW, float64."""
    y = nr.conv(xc, oihw, strides=g.strides, padding=g.padding, layout="NCHW")
    # Input gradient: the full transposed conv, then the padding cut away.
    ct = nr.conv_transpose(dyc, oihw, strides=g.strides, padding=0, layout="NCHW")
    (pl, ph), (ql, qh) = g.padding
    n, c, h, wd = xc.shape
    full = np.zeros((n, c, max(ct.shape[2], pl + h), max(ct.shape[3], ql + wd)))
    full[:, :, : ct.shape[2], : ct.shape[3]] = ct
    dx = full[:, :, pl : pl + h, ql : ql + wd]
    # Weight gradient: dW[o, c, i, j] = sum_{n,h,w} xp[n, c, s*h + i, s*w + j] dy[n, o, h, w].
    xp = np.pad(xc, ((0, 0), (0, 0), (pl, max(ph, 0)), (ql, max(qh, 0))))
    dwc = nr.conv(
        np.transpose(xp, (1, 0, 2, 3)),
        np.transpose(dyc, (1, 0, 2, 3)),
        strides=1,
        dilation=g.strides,
        padding="VALID",
        layout="NCHW",
    )  # (C, O, >=kh, >=kw)
    kh, kw = g.kernel_size
    return y, dx, np.transpose(dwc[:, :, :kh, :kw], (1, 0, 2, 3))


def candidate_errors(
    spec: ConvSpec, outs: Sequence, refs: dict[str, np.ndarray], platform: str | None = None
) -> tuple[dict[str, float], dict[str, float], bool]:
    """``(errors, rtols, passed)`` of outputs ``(y, dx, dw)`` against float64 ``refs``;
    errors are max |actual - expected| / max |expected|. On ``platform="gpu"`` float32 is
    judged as TF32 (``effective_compute_dtype``): else every candidate, XLA's own conv
    included, would fail the float32 bar on Ampere and later."""
    errors, rtols, passed = {}, {}, True
    dtype = effective_compute_dtype(jnp.dtype(spec.dtype), platform)
    for key, out, red in zip(("y", "dx", "dw"), outs, _reductions(spec).values(), strict=True):
        expected = refs[key]
        actual = np.asarray(jnp.asarray(out, jnp.float32))
        scale = float(np.max(np.abs(expected))) or 1.0
        tol = conv_tolerance(dtype, red)
        report = compare(actual, expected, rtol=tol.rtol, atol=tol.rtol * scale, name=key)
        errors[key] = report.max_abs_error / scale
        rtols[key] = tol.rtol
        passed = passed and report.passed
    return errors, rtols, passed
