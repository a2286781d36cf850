"""The built-in algorithms, as values: ``registry`` fills its table with them on its first
lookup (this module does not import the table)."""

from __future__ import annotations

import functools

import layoutlab.nn.conv_algos.depthwise as depthwise
import layoutlab.nn.conv_algos.onednn as onednn
import layoutlab.nn.conv_algos.onednn_hybrid as onednn_hybrid
import layoutlab.nn.conv_algos.pointwise as pointwise
import layoutlab.nn.conv_algos.space_to_depth as space_to_depth
import layoutlab.nn.conv_algos.winograd as winograd
from layoutlab.nn.conv_algos.algorithm import Algorithm, plain_2d
from layoutlab.nn.conv_algos.composed import Methods, core
from layoutlab.nn.conv_algos.native import native_conv, supports_all
from layoutlab.nn.conv_names import XLA

__all__ = ["BUILTIN"]


def _composed(name: str, methods: Methods, description: str) -> Algorithm:
    """A ``composed_conv`` algorithm for ungrouped, undilated convs."""
    return Algorithm(name, core(methods), plain_2d, description)


def _winograd(m: int, suffix: str, weight_grad: str, description: str) -> Algorithm:
    """F(m x m, 3 x 3) forward and input gradient; refuses dtypes past its error bar."""
    return Algorithm(
        f"winograd{m}{suffix}",
        core(Methods(f"winograd{m}", f"winograd{m}", weight_grad)),
        winograd.supports_for(m),
        description,
        functools.partial(winograd.dtype_reason, m),
    )


BUILTIN = (
    Algorithm(XLA, native_conv, supports_all, "XLA's native convolution (the default)"),
    _composed(
        "im2col",
        Methods("gemm", "col2im", "gemm"),
        "patches @ kernel GEMM; dW = P^T dY GEMM(s), dX = col2im(dY W^T)",
    ),
    _composed(
        "gemm_dw",
        Methods("native", "native", "gemm"),
        "XLA forward and input gradient, weight gradient by im2col's GEMM(s)",
    ),
    # XLA's forward and weight gradient; the input gradient as dY @ W^T (a GEMM reading the
    # HWIO kernel where it is) scattered back by col2im. XLA's own input gradient copies a
    # flipped, in/out-swapped kernel first, which at batch 1 costs as much as the conv.
    _composed(
        "col2im_dx",
        Methods("native", "col2im", "native"),
        "XLA forward and weight gradient, input gradient by dY W^T GEMM + col2im",
    ),
    # XLA's forward and weight gradient; a strided conv's input gradient as one stride-1
    # conv per stride phase instead of XLA's conv over a zero-dilated output gradient.
    _composed(
        "phase_dx",
        Methods("native", "phase", "native"),
        "XLA forward and weight gradient, input gradient by one stride-1 conv per stride phase",
    ),
    *(
        _winograd(
            m, "", "gemm", f"Winograd F({m}x{m},3x3) batched GEMMs; dX by Winograd, dW by GEMMs"
        )
        for m in (2, 4)
    ),
    # Winograd forward and dX with XLA's own weight gradient: on XLA:CPU with convs on Eigen
    # (cpu_fast_options) the native dW beats the per-offset GEMMs, while Winograd's fewer
    # multiplies still pay in the two 3x3 stride-1 convs (docs/guides/conv-algorithms.md).
    *(
        _winograd(
            m,
            "_xla_dw",
            "native",
            f"Winograd F({m}x{m},3x3) forward and dX, XLA's native weight gradient",
        )
        for m in (2, 4)
    ),
    # All three convs by Winograd: F(4x4,3x3) forward and dX, F(3x3,4x4) dW. With dots on
    # YNNPACK, which uses AVX-512 where the CPU has it while XLA:CPU's Eigen convs do not,
    # this is the fastest 3x3 stride-1 training conv measured on such CPUs
    # (docs/guides/conv-algorithms.md).
    _winograd(
        4, "_full", "winograd4", "Winograd F(4x4,3x3) forward and dX, F(3x3,4x4) weight gradient"
    ),
    Algorithm(
        "pointwise",
        pointwise.pointwise_conv,
        pointwise.supports,
        "1x1 conv as strided slice + dot (JAX autodiff)",
    ),
    Algorithm(
        "s2d",
        space_to_depth.space_to_depth_conv,
        space_to_depth.supports,
        "stride-2 conv as a stride-1 conv on a space-to-depth input (JAX autodiff)",
    ),
    Algorithm(
        "depthwise",
        depthwise.depthwise_conv,
        depthwise.supports,
        "depthwise conv as shifted multiply-adds, one kernel tap per channel (JAX autodiff)",
    ),
    # oneDNN's primitives through XLA FFI custom calls (native/), where the extension loads;
    # elsewhere, and for shapes oneDNN would run by its reference kernels, XLA's conv.
    Algorithm(
        "onednn",
        onednn.onednn_core,
        onednn.supports,
        "oneDNN forward, input- and weight-gradient primitives via XLA FFI (CPU; XLA elsewhere)",
        onednn.dtype_reason,
        custom_calls=True,
        rounds_once=True,
        rounds_kernel=True,
    ),
    # oneDNN's forward and input gradient with XLA's weight gradient: oneDNN's weight
    # gradient loses at small batch and spatial sizes where its other two passes win
    # (docs/performance/measurements.md#conv-algorithms).
    Algorithm(
        "onednn_xla_dw",
        onednn_hybrid.onednn_xla_dw_core,
        onednn.supports,
        "oneDNN forward and input gradient via XLA FFI, XLA's weight gradient (CPU; XLA elsewhere)",
        onednn.dtype_reason,
        custom_calls=True,
        rounds_once=True,
    ),
)
