"""The ``onednn`` conv algorithm: forward, input gradient and weight gradient as oneDNN
primitives called through XLA FFI custom calls (``native/``), with a custom VJP.

Activations are NHWC, kernels HWIO, XLA's buffers as they are. ``onednn_conv`` also takes NCHW
activations, but with plain NCHW tensors oneDNN 3.2 has only its GEMM-based kernels, slower than its
NHWC ones plus XLA's two transposes (docs/performance/measurements.md#conv-algorithms). So the
registry core takes NHWC only and ``conv2d`` transposes an NCHW conv in and out, where XLA can fuse
the transposes with their neighbours (an NCHW model on CPU computes channels-last inside anyway).
Operands are float32 or bfloat16 and accumulate in float32 inside oneDNN; the forward writes
``preferred_element_type`` (float32 from bfloat16 operands, as autocast's) or the operands' dtype.
The kernel may also be float32 beside bfloat16 activations (``Algorithm.rounds_kernel``): the
forward and the input gradient round it in the weight reorder they run anyway, the bits XLA's
convert would give, so no convert pass runs in front of the call.
The backward casts the cotangent to the activations' dtype, as autocast does, writes the input
gradient in that dtype and the weight gradient in the accumulation dtype (then the kernel's).
Which primitive variant a call runs (the kernel read or written as HWIO, or a bfloat16 weight
gradient computed by the float32 primitive) follows ``choice``, by the call's shape.

``supports`` refuses a conv (so XLA's conv runs, with the reason) when the extension is not
available, for dtypes other than float32 and bfloat16, for negative padding, and where oneDNN
would run one of its reference ("ref") kernels for any of the three primitives: it asks the
extension at trace time which implementation each would get. Off CPU the algorithm lowers
XLA's conv (``lax.platform_dependent``), so a GPU program holds no custom call.

Determinism: oneDNN 3.2 has no deterministic attribute (``primitive_attr::set_deterministic``
is in oneDNN 3.4's documentation, not in 3.2's headers). oneDNN documents its CPU primitives
as run-to-run bitwise deterministic in a fixed environment (same CPU, library, thread count
and environment variables); the attribute exists for implementations built on atomics, which
the ones that run here are not. ``tests/nn/test_onednn_conv.py`` checks that a step's gradients
repeat to the bit.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from layoutlab.nn.conv_algos.batch_sharded import batch_parallel, batch_reduced
from layoutlab.nn.conv_algos.geometry import ConvSpec, Geometry, make_spec
from layoutlab.nn.conv_algos.native import native_conv
from layoutlab.nn.conv_algos.onednn_load import (
    TARGET_PREFIX,
    TARGETS,
    available,
    impl_info,
    register_targets,
    status_line,
    unavailable_reason,
)
from layoutlab.nn.conv_algos.onednn_packed import packed_forward

__all__ = [
    "TARGET_PREFIX",
    "available",
    "dtype_reason",
    "onednn_conv",
    "onednn_core",
    "status_line",
    "supports",
    "unavailable_reason",
]

_DTYPES = {"float32": 0, "bfloat16": 1}
_FWD, _BWD_DATA, _BWD_WEIGHTS = 0, 1, 2


def dtype_reason(dtype: str) -> str | None:
    if dtype in _DTYPES:
        return None
    return f"compute dtype {dtype} (oneDNN convs take float32 and bfloat16)"


def _attrs(geom: Geometry, layout: str, choice: tuple[bool, bool]) -> dict:
    (plh, prh), (plw, prw) = geom.padding
    values = dict(
        nchw=int(layout == "NCHW"),
        sh=geom.strides[0],
        sw=geom.strides[1],
        plh=plh,
        plw=plw,
        prh=prh,
        prw=prw,
        dh=geom.dilation[0],
        dw=geom.dilation[1],
        groups=geom.groups,
        plain_weights=int(choice[0]),
        f32_compute=int(choice[1]),
    )
    return {k: np.int64(v) for k, v in values.items()}


def _params(
    op: int, dts: tuple[str, str, str], spec: ConvSpec, choice=(False, False), nchw=False
) -> tuple[int, ...]:
    """The extension's parameter tuple (see ``native/onednn_conv.h``: ``Params``) of the
    primitive for ``spec``: NHWC whatever the spec's layout, as the registry core runs it
    (see the module docstring), unless ``nchw``."""
    g = spec.geometry
    (plh, prh), (plw, prw) = g.padding
    ho, wo = spec.out_size
    return (
        op,
        *(_DTYPES[d] for d in dts),
        int(nchw),
        spec.batch,
        spec.in_features,
        *spec.in_size,
        spec.out_features,
        *g.kernel_size,
        ho,
        wo,
        *g.strides,
        plh,
        plw,
        prh,
        prw,
        *g.dilation,
        g.groups,
        *(int(c) for c in choice),
    )


# Up to this many output pixels (batch * Ho * Wo) a float32 forward reads the HWIO kernel as
# it is (oneDNN then runs its GEMM-based kernel): reordering it into the blocked format costs
# more than the conv itself. The bfloat16 forward's blocked kernel stayed faster.
PLAIN_WEIGHTS_MAX_PIXELS = 64
# The same for the weight gradient, which writes HWIO itself instead of reordering the blocked
# gradient back, by the activations' dtype.
PLAIN_WEIGHT_GRADIENT_MAX_PIXELS = {"float32": 32, "bfloat16": 64}
# Below this batch a bfloat16 weight gradient with more output pixels runs the float32
# primitive on converted activations up to this many output pixels, or per image, and on
# strided convs with a spatial kernel: oneDNN 3.2's bfloat16 weight-gradient kernel (without
# AMX) was several times slower there at batch 1. From this batch on its own kernel ran every
# such conv of ResNet-18 CIFAR and ResNet-50 faster, and their whole training steps too.
BF16_WEIGHT_GRADIENT_MIN_BATCH = 8
F32_WEIGHT_GRADIENT_MAX_PIXELS = 1024
F32_WEIGHT_GRADIENT_MAX_IMAGE_PIXELS = 64
# At any batch for a conv with fewer input channels per group than this: oneDNN 3.2's direct
# bfloat16 weight-gradient kernel blocks channels by 16 (a stem conv of 3 channels ran 25-35x
# slower than float32).
F32_WEIGHT_GRADIENT_MIN_CHANNELS = 16
# The measurements behind all six: docs/performance/onednn_kernels.md.


def plain_weights(dtype: str, out_pixels: int) -> bool:
    """Whether the forward of a ``dtype`` conv writing ``out_pixels`` (batch * Ho * Wo)
    reads the kernel without a reorder."""
    return dtype == "float32" and out_pixels <= PLAIN_WEIGHTS_MAX_PIXELS


def slow_bf16_weight_gradient(geom: Geometry, in_channels: int, batch: int) -> bool:
    """Whether ``geom`` with ``in_channels`` input channels at ``batch`` is a shape oneDNN's
    direct bfloat16 weight-gradient kernel runs far slower than its float32 one: few input
    channels per group at any batch, a strided spatial kernel at a small batch."""
    if in_channels // geom.groups < F32_WEIGHT_GRADIENT_MIN_CHANNELS:
        return True
    strided = geom.strides != (1, 1) and geom.kernel_size != (1, 1)
    return strided and batch < BF16_WEIGHT_GRADIENT_MIN_BATCH


def choice(
    op: int, dtype: str, batch: int, out_pixels: int, slow_bf16: bool = False
) -> tuple[bool, bool]:
    """``(plain_weights, f32_compute)`` of primitive ``op`` for a conv of ``dtype``
    activations with ``out_pixels`` output pixels (batch * Ho * Wo); ``slow_bf16``: the
    shape is one of ``slow_bf16_weight_gradient``'s."""
    if op == _FWD:
        return plain_weights(dtype, out_pixels), False
    if op != _BWD_WEIGHTS:
        return False, False
    if out_pixels <= PLAIN_WEIGHT_GRADIENT_MAX_PIXELS.get(dtype, 0):
        return True, False
    small = batch < BF16_WEIGHT_GRADIENT_MIN_BATCH and (
        out_pixels <= F32_WEIGHT_GRADIENT_MAX_PIXELS
        or out_pixels <= F32_WEIGHT_GRADIENT_MAX_IMAGE_PIXELS * batch
    )
    return False, dtype == "bfloat16" and (slow_bf16 or small)


def _queries(dtype: str) -> list[tuple[str, int, tuple[str, str, str]]]:
    """(what, op, (src, weights, dst) dtypes) of every primitive a conv in ``dtype`` may run:
    the forward to each output dtype, and the two gradients as ``_bwd`` calls them."""
    outs = dict.fromkeys((dtype, "float32"))
    return [
        *((f"forward to {out}", _FWD, (dtype, dtype, out)) for out in outs),
        *((f"weight gradient to {out}", _BWD_WEIGHTS, (dtype, out, dtype)) for out in outs),
        ("input gradient", _BWD_DATA, (dtype, dtype, dtype)),
    ]


def supports(spec: ConvSpec) -> str | None:
    why = dtype_reason(spec.dtype)
    if why is not None:
        return why
    if any(p < 0 for pair in spec.geometry.padding for p in pair):
        return f"negative padding {spec.geometry.padding} (a cropping conv)"
    if not available():
        return f"oneDNN convs unavailable: {unavailable_reason()}"
    ho, wo = spec.out_size
    pixels = spec.batch * ho * wo
    for what, op, dts in _queries(spec.dtype):
        slow = slow_bf16_weight_gradient(spec.geometry, spec.in_features, spec.batch)
        how = choice(op, spec.dtype, spec.batch, pixels, slow)
        info = impl_info(_params(op, dts, spec, how))
        if isinstance(info, str):
            return f"its {what}: {info}"
        if "ref" in info[0]:
            return f"its {what}, which oneDNN would run with its reference kernel {info[0]!r}"
    return None


_OPS = {"fwd": _FWD, "bwd_data": _BWD_DATA, "bwd_weights": _BWD_WEIGHTS}


def _call(target: str, shape, dtype, a, b, geom: Geometry, layout: str):
    if not available():
        raise RuntimeError(f"oneDNN convs unavailable: {unavailable_reason()}")
    register_targets()
    out = jax.ShapeDtypeStruct(shape, dtype)
    call = jax.ffi.ffi_call(TARGETS[target], out, vmap_method="sequential")
    y = {"fwd": shape, "bwd_data": a.shape, "bwd_weights": b.shape}[target]  # y or dy
    channels = a.shape[1 if layout == "NCHW" else 3]
    how = _choice_of(target, a.dtype.name, y, layout, geom, channels)
    return call(a, b, **_attrs(geom, layout, how))


def _choice_of(target: str, dtype: str, y, layout: str, geom: Geometry, in_channels: int):
    """``choice`` for a call of ``target`` whose output (or cotangent) has shape ``y``."""
    pixels = math.prod(y) // y[1 if layout == "NCHW" else 3]
    slow = target == "bwd_weights" and slow_bf16_weight_gradient(geom, in_channels, y[0])
    return choice(_OPS[target], dtype, y[0], pixels, slow)


def _with_batch(shape, n: int) -> tuple[int, ...]:
    return (n, *shape[1:])


def _out_shape(x_shape, w_shape, geom: Geometry, layout: str):
    n = x_shape[0]
    if layout == "NHWC":
        ho, wo = geom.out_size(tuple(x_shape[1:3]))
        return (n, ho, wo, w_shape[3])
    ho, wo = geom.out_size(tuple(x_shape[2:4]))
    return (n, w_shape[3], ho, wo)


# Each call goes through ``batch_sharded``: under a data-parallel or FSDP sharding XLA's
# partitioner cannot see into a custom call and would gather the batch in front of it, so
# every device convolves its own rows instead (the weight gradient sums over the devices).


def _forward(x, w, geom, preferred, layout):
    out_dtype = jnp.dtype(preferred) if preferred is not None else x.dtype

    def fwd(a, b):
        return _call("fwd", _out_shape(a.shape, b.shape, geom, layout), out_dtype, a, b, geom,
                     layout)  # fmt: skip

    # Inference with packed kernels (``onednn_packed``) reads a kernel reordered beforehand.
    params = _fwd_params(x, w, out_dtype, geom, layout)
    return packed_forward(params, x, lambda kernel=w: batch_parallel(fwd, 1)(x, kernel))


def _fwd_params(x, w, y_dtype, geom: Geometry, layout: str) -> tuple[int, ...]:
    """The parameter tuple the forward handler builds from these buffers (``MakeParams``)."""
    spec = make_spec(x.shape, w.shape[3], geom, x.dtype, layout)
    y = _out_shape(x.shape, w.shape, geom, layout)
    how = _choice_of("fwd", x.dtype.name, y, layout, geom, spec.in_features)
    dts = (x.dtype.name, w.dtype.name, jnp.dtype(y_dtype).name)
    return _params(_FWD, dts, spec, how, nchw=layout == "NCHW")


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def onednn_conv(x, w, geom: Geometry, preferred, layout: str = "NHWC"):
    """``layout`` (NHWC or NCHW) x HWIO conv by oneDNN on CPU (no platform switch: see
    ``onednn_core``); raises where the extension is unavailable."""
    return _forward(x, w, geom, preferred, layout)


def _fwd(x, w, geom, preferred, layout):
    return _forward(x, w, geom, preferred, layout), (x, w)


def _bwd(geom, preferred, layout, res, g):
    x, w = res
    acc = jnp.dtype(preferred) if preferred is not None else x.dtype
    g = g.astype(x.dtype)

    def bwd_data(dy, b):
        shape = _with_batch(x.shape, dy.shape[0])
        return _call("bwd_data", shape, x.dtype, dy, b, geom, layout)

    def bwd_weights(a, dy):
        return _call("bwd_weights", w.shape, acc, a, dy, geom, layout)

    dx = batch_parallel(bwd_data, 1)(g, w)
    dw = batch_reduced(bwd_weights)(x, g)
    return dx, dw.astype(w.dtype)


onednn_conv.defvjp(_fwd, _bwd)


def _handled(x, w, preferred) -> bool:
    """Operand and output dtypes the primitives take (the supported specs all pass): the
    kernel in the activations' dtype, or a float32 kernel beside bfloat16 activations."""
    out = jnp.dtype(preferred) if preferred is not None else x.dtype
    return (
        w.dtype.name in (x.dtype.name, "float32")
        and x.dtype.name in _DTYPES
        and out.name in (x.dtype.name, "float32")
        and available()
    )


def onednn_core(x, w, geom: Geometry, preferred, layout: str = "NHWC"):
    """The registry core: oneDNN on CPU, XLA's conv on every other platform (and for an
    operand pairing the primitives do not take)."""

    def native(a, b):
        return native_conv(a, b.astype(a.dtype), geom, preferred, (layout, "HWIO", layout))

    if not _handled(x, w, preferred):
        return native(x, w)

    def cpu(a, b):
        return onednn_conv(a, b, geom, preferred, layout)

    return lax.platform_dependent(x, w, cpu=cpu, default=native)
