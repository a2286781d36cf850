"""Layout- and policy-aware Flax NNX layers.

Every layer takes ``layout`` (``Layout`` or its name) and ``policy`` (``Policy`` or a spec
understood by ``get_policy``). Convs, norms and pooling work in 1D, 2D and 3D layouts.
"""

from layoutlab.nn.activation import ReLU, ReLU6
from layoutlab.nn.base import LayoutModule
from layoutlab.nn.conv import KERNEL_STORAGES, Conv, ConvTranspose
from layoutlab.nn.conv_config import (
    check_conv_options,
    configure_convs,
    missing_from_plan,
    set_conv_algorithm,
    set_kernel_storage,
    with_conv_plan,
)
from layoutlab.nn.convert import convert_layout
from layoutlab.nn.linear import Dense, Dropout, Flatten
from layoutlab.nn.norm import BatchNorm, GroupNorm
from layoutlab.nn.pooling import AdaptiveAvgPool, AvgPool, GlobalAvgPool, MaxPool
from layoutlab.nn.upsample import Upsample

__all__ = [
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
    "check_conv_options",
    "configure_convs",
    "convert_layout",
    "missing_from_plan",
    "set_conv_algorithm",
    "with_conv_plan",
    "set_kernel_storage",
]
