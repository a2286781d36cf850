"""Layout- and policy-aware Flax NNX layers.

Every layer takes ``layout`` (``Layout`` or its name) and ``policy`` (``Policy`` or a spec
understood by ``get_policy``). Convs, norms and pooling work in 1D, 2D and 3D layouts.


Names load lazily (``layoutlab.lazy``), so importing the package, as the CLI does
to build its parser, imports no JAX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from layoutlab.lazy import lazy_exports

if TYPE_CHECKING:
    from layoutlab.nn.activation import ReLU, ReLU6
    from layoutlab.nn.base import LayoutModule
    from layoutlab.nn.conv import Conv, ConvTranspose
    from layoutlab.nn.conv_config import (
        check_conv_options,
        configure_convs,
        missing_from_plan,
        running_algorithms,
        set_conv_algorithm,
        set_kernel_storage,
        with_conv_plan,
    )
    from layoutlab.nn.conv_names import ACTIVATION_STORAGES, KERNEL_STORAGES
    from layoutlab.nn.convert import (
        activation_storage,
        check_activation_storage,
        convert_layout,
        set_activation_storage,
    )
    from layoutlab.nn.linear import Dense, Dropout, Flatten
    from layoutlab.nn.norm import BatchNorm, GroupNorm
    from layoutlab.nn.pooling import AdaptiveAvgPool, AvgPool, GlobalAvgPool, MaxPool
    from layoutlab.nn.upsample import Upsample

_EXPORTS = {
    "ReLU": "activation",
    "ReLU6": "activation",
    "LayoutModule": "base",
    "ACTIVATION_STORAGES": "conv_names",
    "KERNEL_STORAGES": "conv_names",
    "Conv": "conv",
    "ConvTranspose": "conv",
    "check_conv_options": "conv_config",
    "configure_convs": "conv_config",
    "missing_from_plan": "conv_config",
    "running_algorithms": "conv_config",
    "set_conv_algorithm": "conv_config",
    "set_kernel_storage": "conv_config",
    "with_conv_plan": "conv_config",
    "activation_storage": "convert",
    "check_activation_storage": "convert",
    "convert_layout": "convert",
    "set_activation_storage": "convert",
    "Dense": "linear",
    "Dropout": "linear",
    "Flatten": "linear",
    "BatchNorm": "norm",
    "GroupNorm": "norm",
    "AdaptiveAvgPool": "pooling",
    "AvgPool": "pooling",
    "GlobalAvgPool": "pooling",
    "MaxPool": "pooling",
    "Upsample": "upsample",
}

__all__ = [
    "ACTIVATION_STORAGES",
    "AdaptiveAvgPool",
    "AvgPool",
    "BatchNorm",
    "Conv",
    "ConvTranspose",
    "Dense",
    "Dropout",
    "Flatten",
    "GlobalAvgPool",
    "GroupNorm",
    "KERNEL_STORAGES",
    "LayoutModule",
    "MaxPool",
    "ReLU",
    "ReLU6",
    "Upsample",
    "activation_storage",
    "check_activation_storage",
    "check_conv_options",
    "configure_convs",
    "convert_layout",
    "missing_from_plan",
    "running_algorithms",
    "set_activation_storage",
    "set_conv_algorithm",
    "with_conv_plan",
    "set_kernel_storage",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, lambda: set(globals()))
