"""The names of conv settings, without the code behind them.

Argument parsers read these to write their help (``layoutlab train --help`` must not import
JAX); ``tests/cli/test_cli_fast_start.py`` checks ``BUILTIN_ALGORITHMS`` against the registry.
"""

__all__ = ["ACTIVATION_STORAGES", "AUTO", "BUILTIN_ALGORITHMS", "KERNEL_STORAGES", "XLA"]


XLA = "xla"
AUTO = "auto"
# How a conv's kernel is stored: in the layer's layout, or HWIO (channels-last) always.
KERNEL_STORAGES = ("layout", "channels_last")
# Where a channels-first model computes: in its own layout, or channels-last inside with its
# inputs and spatial outputs transposed at the edges (PyTorch's channels_last memory format).
ACTIVATION_STORAGES = ("layout", "channels_last")
BUILTIN_ALGORITHMS = (
    "xla",
    "im2col",
    "gemm_dw",
    "col2im_dx",
    "phase_dx",
    "winograd2",
    "winograd4",
    "winograd2_xla_dw",
    "winograd4_xla_dw",
    "winograd4_full",
    "pointwise",
    "s2d",
    "depthwise",
    "onednn",
    "onednn_xla_dw",
)
