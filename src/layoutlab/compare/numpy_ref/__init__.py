"""Independent float64 NumPy reference implementations of the ops layoutlab's models use.

Only NumPy: no jax, no lax, and not even ``layoutlab.layout``, so a bug there cannot hide in
both the op and its reference. Every result is float64. Ops are computed in channels-first
order (N, C, spatial...) with plain loops over kernel offsets and einsum; channels-last inputs
are transposed in and out. Kernels come in the layout's kernel order: spatial..., in, out
(``HWIO``) for channels-last layouts, out, in, spatial... (``OIHW``) for channels-first ones.
Meant for tiny shapes in tests, not for speed. These refs are cross-checked against PyTorch
in ``tests/compare/test_numpy_ref.py``. One module per kind of op; all of them are reached from here
(``from layoutlab.compare import numpy_ref as ref; ref.conv(...)``).
"""

from layoutlab.compare.numpy_ref.classifier import dense, flatten, relu, softmax_cross_entropy
from layoutlab.compare.numpy_ref.convolution import conv, conv_transpose
from layoutlab.compare.numpy_ref.normalization import (
    batch_norm,
    batch_norm_running_update,
    group_norm,
)
from layoutlab.compare.numpy_ref.pooling import (
    adaptive_avg_pool,
    avg_pool,
    global_avg_pool,
    max_pool,
)
from layoutlab.compare.numpy_ref.resampling import upsample_bilinear, upsample_nearest
from layoutlab.compare.numpy_ref.windows import same_padding

__all__ = [
    "conv",
    "conv_transpose",
    "same_padding",
    "max_pool",
    "avg_pool",
    "adaptive_avg_pool",
    "global_avg_pool",
    "batch_norm",
    "batch_norm_running_update",
    "group_norm",
    "upsample_nearest",
    "upsample_bilinear",
    "dense",
    "flatten",
    "relu",
    "softmax_cross_entropy",
]
