"""Winograd F(2x2, 3x3) and F(4x4, 3x3) for stride-1 3x3 convs, as batched GEMMs.

The padded input is cut into overlapping ``a x a`` tiles (``a = m + 2``) with stride ``m``;
each tile is transformed, ``V = B^T d B``, the kernel too, ``U = G g G^T``, and for each of
the ``a * a`` tile positions one GEMM over (tiles x in-channels) x (in x out-channels) gives
``M``; the inverse transform ``Y = A^T M A`` yields an ``m x m`` block of outputs per tile.
That is ``a**2 / (9 m**2)`` of the direct conv's multiplies in the GEMMs (F(2,3): 0.44,
F(4,3): 0.25), paid for with data movement in the transforms.

The transforms run in float32 whatever the compute dtype (half precision is cast for the
GEMM only), each as one small GEMM with the Kronecker product of the 1D matrices; the
matrices' entries up to 8 (F(4,3)) make the rounding error larger than a direct conv's,
which the tests and benchmarks measure.

Backward (``composed``): the input gradient of a stride-1 3x3 conv is again a stride-1
3x3 conv, of ``dY`` with the kernel flipped and its channels swapped, so it runs through
Winograd too. The weight gradient is the per-offset GEMM of ``im2col.weight_grad``, XLA's
own, or Winograd F(3x3, m x m) (``winograd_weight_grad``): the dual of F(m x m, 3 x 3), with
an ``m x m`` tile of ``dY`` as the filter and the 3x3 kernel as the output.
(JAX can also differentiate ``winograd_forward`` itself; that was measured much slower for
F(4x4, 3x3), see ``benchmarks/conv_algos.py``.)
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
from jax import lax

from layoutlab.nn.conv_algos.algorithm import plain_2d
from layoutlab.nn.conv_algos.geometry import ConvSpec
from layoutlab.nn.conv_algos.im2col import pad_input

__all__ = [
    "ACCURATE_DTYPES",
    "TRANSFORMS",
    "dtype_reason",
    "input_tiles",
    "kernel_tiles",
    "matrices",
    "output_tiles",
    "shape_reason",
    "supports_for",
    "winograd_forward",
    "winograd_weight_grad",
]


# Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks" (2016).
_F2 = {
    "BT": [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
    "G": [[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]],
    "AT": [[1, 1, 1, 0], [0, 1, -1, -1]],
}
_F4 = {
    "BT": [
        [4, 0, -5, 0, 1, 0],
        [0, -4, -4, 1, 1, 0],
        [0, 4, -4, -1, 1, 0],
        [0, -2, -1, 2, 1, 0],
        [0, 2, -1, -2, 1, 0],
        [0, 4, 0, -5, 0, 1],
    ],
    "G": [
        [1 / 4, 0, 0],
        [-1 / 6, -1 / 6, -1 / 6],
        [-1 / 6, 1 / 6, -1 / 6],
        [1 / 24, 1 / 12, 1 / 6],
        [1 / 24, -1 / 12, 1 / 6],
        [0, 0, 1],
    ],
    "AT": [
        [1, 1, 1, 1, 1, 0],
        [0, 1, -1, 2, -2, 0],
        [0, 1, 1, 4, 4, 0],
        [0, 1, -1, 8, -8, 1],
    ],
}
TRANSFORMS = {2: _F2, 4: _F4}


def matrices(m: int) -> dict[str, np.ndarray]:
    """``BT``, ``G``, ``AT`` of F(m x m, 3 x 3) as float64 arrays."""
    if m not in TRANSFORMS:
        raise ValueError(f"Winograd tile size m must be 2 or 4, got {m}.")
    return {k: np.asarray(v, np.float64) for k, v in TRANSFORMS[m].items()}


# Compute dtypes whose error stays within the project's bar (``compare.default_tolerance``
# of the dtype, plus float32 accumulation: ``bench.tuning.conv_reference.conv_tolerance``), measured
# against float64 NumPy in tests/nn/test_conv_algos.py (test_winograd_dtypes_follow_measured_error).
# F(2x2,3x3) (entries up to 1) about doubles a direct conv's error: bfloat16 ~4.6e-3 and
# float16 ~5.7e-4 normwise, within 1.6e-2 and 1e-3. F(4x4,3x3) (entries up to 8) magnifies
# it about 10x: bfloat16 ~2.5e-2 normwise (max error 5-6e-2 of max|ref|), float16 ~3e-3, past
# both bars. float64 is refused by both: the transforms run in float32, whose error
# (2e-7 to 2e-6 measured) is past the float64 bar of 1e-7.
ACCURATE_DTYPES = {2: ("float32", "bfloat16", "float16"), 4: ("float32",)}


def dtype_reason(m: int, dtype) -> str | None:
    """Why Winograd F(m x m, 3 x 3) refuses compute ``dtype`` (a name or dtype), or None."""
    name = jnp.dtype(dtype).name
    if name in ACCURATE_DTYPES[m]:
        return None
    if name == "float64":
        return "float64 compute (the Winograd transforms run in float32; use xla)"
    also = " or winograd2" if name in ACCURATE_DTYPES[2] else ""
    return (
        f"{name} compute (F({m}x{m},3x3)'s transforms magnify {name} rounding past its "
        f"error bar; use xla{also}, or float32 compute)"
    )


def shape_reason(spec: ConvSpec) -> str | None:
    reason = plain_2d(spec)
    if reason:
        return reason
    g = spec.geometry
    if g.kernel_size != (3, 3):
        return f"kernel {g.kernel_size} (Winograd here is for 3x3 kernels)"
    if g.strides != (1, 1):
        return f"strides {g.strides} (Winograd needs stride 1)"
    return None


def supports_for(m: int) -> Callable[[ConvSpec], str | None]:
    """The registry ``supports`` of F(m x m, 3 x 3): the shape, then the compute dtype."""

    def supports(spec: ConvSpec) -> str | None:
        return shape_reason(spec) or dtype_reason(m, spec.dtype)

    return supports


def _strided_tiles(xp, m: int, tiles, layout: str):
    """``(a*a, N, th, tw, C)``: the ``a x a`` tiles of ``xp`` (``layout`` NHWC or NCHW) at
    stride ``m``, one strided slice per position inside the tile. From NCHW each slice is
    moved channels-last in the same fusion that writes the tiles, so no copy of ``xp`` in
    NHWC is ever made."""
    a = m + 2
    th, tw = tiles
    hi = (th - 1) * m + 1, (tw - 1) * m + 1
    if layout == "NHWC":
        n, c = xp.shape[0], xp.shape[3]
        return jnp.stack(
            [
                lax.slice(xp, (0, i, j, 0), (n, i + hi[0], j + hi[1], c), (1, m, m, 1))
                for i in range(a)
                for j in range(a)
            ]
        )
    n, c = xp.shape[:2]
    return jnp.stack(
        [
            jnp.transpose(
                lax.slice(xp, (0, 0, i, j), (n, c, i + hi[0], j + hi[1]), (1, 1, m, m)),
                (0, 2, 3, 1),
            )
            for i in range(a)
            for j in range(a)
        ]
    )


def _spatial(x, layout: str) -> tuple[int, int]:
    return tuple(x.shape[1:3] if layout == "NHWC" else x.shape[2:4])


def _pad_spatial(x, padding, layout: str):
    """Zero-pad (negative: crop) the spatial axes of an NHWC or NCHW array."""
    if layout == "NHWC":
        return pad_input(x, padding)
    zero = jnp.zeros((), x.dtype)
    return lax.pad(x, zero, ((0, 0, 0), (0, 0, 0), *((lo, hi, 0) for lo, hi in padding)))


def _apply(kron: np.ndarray, t):
    """``kron @ t`` over the leading (tile position) axis, in float32.

    The 2D transform ``B^T d B`` of every tile is one product with ``B^T (x) B^T``: a GEMM
    with a short (36 or 16) contraction, which XLA:CPU runs faster than unrolled sums.
    """
    flat = t.reshape(t.shape[0], -1)
    out = lax.dot_general(
        jnp.asarray(kron, jnp.float32),
        flat,
        (((1,), (0,)), ((), ())),
        precision=lax.Precision.HIGHEST,
    )
    return out.reshape(kron.shape[0], *t.shape[1:])


def input_tiles(x, m: int, padding, out_size, layout: str = "NHWC"):
    """``V``: ``(a*a, N * th * tw, C)`` transformed tiles of ``x`` (NHWC or NCHW), in
    float32, and ``(th, tw)``."""
    bt = matrices(m)["BT"]
    th, tw = (-(-out_size[0] // m), -(-out_size[1] // m))
    # Pad the high side further so that th * m rows of output have a full tile each.
    h, w = _spatial(x, layout)
    (plh, _), (plw, _) = padding
    extra = ((plh, th * m + 2 - h - plh), (plw, tw * m + 2 - w - plw))
    xp = _pad_spatial(x.astype(jnp.float32), extra, layout)
    d = _strided_tiles(xp, m, (th, tw), layout)
    v = _apply(np.kron(bt, bt), d)
    return v.reshape(v.shape[0], -1, d.shape[-1]), (th, tw)


def kernel_tiles(w, m: int):
    """``U = G g G^T`` for each (in, out) channel pair: ``(a*a, C, O)`` in float32."""
    g = matrices(m)["G"]
    u = _apply(np.kron(g, g), w.astype(jnp.float32).reshape(9, *w.shape[2:]))
    return u


def output_tiles(mm, m: int, n: int, tiles, out_size, layout: str = "NHWC"):
    """``Y = A^T M A`` and untile: ``(a*a, N*th*tw, O)`` -> ``(N, Ho, Wo, O)``, or
    ``(N, O, Ho, Wo)`` for NCHW (the untiling permutes every element either way)."""
    at = matrices(m)["AT"]
    th, tw = tiles
    o = mm.shape[-1]
    y = _apply(np.kron(at, at), mm).reshape(m, m, n, th, tw, o)
    if layout == "NHWC":
        y = jnp.transpose(y, (2, 3, 0, 4, 1, 5)).reshape(n, th * m, tw * m, o)
        return y[:, : out_size[0], : out_size[1], :]
    y = jnp.transpose(y, (2, 5, 3, 0, 4, 1)).reshape(n, o, th * m, tw * m)
    return y[:, :, : out_size[0], : out_size[1]]


def winograd_forward(x, w, padding, m: int, preferred, layout: str = "NHWC"):
    """Stride-1 3x3 conv of ``x`` (``layout`` NHWC or NCHW, the output's too) and HWIO
    ``w`` with explicit ``padding`` pairs."""
    spatial = _spatial(x, layout)
    out_size = tuple(n + lo + hi - 2 for n, (lo, hi) in zip(spatial, padding, strict=True))
    v, tiles = input_tiles(x, m, padding, out_size, layout)
    u = kernel_tiles(w, m)
    compute = x.dtype
    mm = lax.dot_general(
        v.astype(compute),
        u.astype(compute),
        (((2,), (1,)), ((0,), (0,))),
        preferred_element_type=jnp.float32,
    )
    y = output_tiles(mm, m, x.shape[0], tiles, out_size, layout)
    return y.astype(preferred if preferred is not None else compute)


def winograd_weight_grad(x, g, padding, m: int, preferred, layout: str = "NHWC"):
    """``dW`` (HWIO, 3x3) of a stride-1 3x3 conv of ``x`` with output gradient ``g`` (both
    ``layout``, NHWC or NCHW).

    Per tile, ``dW = G^T [(A E A^T) * (B^T D B)] G`` with ``D`` the ``a x a`` input tile and
    ``E`` the ``m x m`` tile of ``g`` it produced: the forward identity
    ``sum(E * Y) = sum((A E A^T) * (G g G^T) * (B^T D B))`` differentiated in ``g``. The sum
    over tiles and images is one GEMM per tile position (contracting tiles x images), and
    the ``G^T . G`` transform runs once on the summed ``(a*a, C, O)`` result: ``a**2 / 9``
    GEMMs over ``1 / m**2`` of the positions, i.e. the forward's 0.25 of the multiplies for
    F(4x4, 3x3).
    """
    mats = matrices(m)
    out_size = _spatial(g, layout)
    v, (th, tw) = input_tiles(x, m, padding, out_size, layout)  # (a*a, N*th*tw, C), float32
    n, o = g.shape[0], g.shape[-1 if layout == "NHWC" else 1]
    gp = _pad_spatial(
        g.astype(jnp.float32), ((0, th * m - out_size[0]), (0, tw * m - out_size[1])), layout
    )
    # (N, th*m, tw*m, O) -> (m*m, N*th*tw, O): the non-overlapping m x m tiles of dY.
    if layout == "NHWC":
        e = gp.reshape(n, th, m, tw, m, o).transpose(2, 4, 0, 1, 3, 5)
    else:
        e = gp.reshape(n, o, th, m, tw, m).transpose(3, 5, 0, 2, 4, 1)
    e = e.reshape(m * m, -1, o)
    a_mat = mats["AT"].T
    ee = _apply(np.kron(a_mat, a_mat), e)  # (a*a, N*th*tw, O)
    compute = x.dtype
    mm = lax.dot_general(
        v.astype(compute),
        ee.astype(compute),
        (((1,), (1,)), ((0,), (0,))),
        preferred_element_type=jnp.float32,
    )  # (a*a, C, O)
    gt = mats["G"].T
    dw = _apply(np.kron(gt, gt), mm).reshape(3, 3, *mm.shape[1:])
    return dw.astype(preferred if preferred is not None else compute)
