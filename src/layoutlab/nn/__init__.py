"""Layout- and policy-aware Flax NNX layers.

Every layer takes a ``layout`` (a ``Layout``) and a ``policy`` (a ``Policy``, None: ``fp32``);
a name is parsed once, at the edges (``parse_layout``, ``get_policy``), and a string given to
a layer raises ``TypeError``. Convs, norms and pooling work in 1D, 2D and 3D layouts.
``configure(model, settings)`` returns a copy whose convs run other ``ConvSettings`` (or a
conv plan); what a model's convs are and run: ``nn.conv_config``.

Names load lazily (``layoutlab.lazy``), so importing the package, as the CLI does
to build its parser, imports no JAX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from layoutlab.lazy import lazy_exports

if TYPE_CHECKING:
    from layoutlab.nn.activation import ReLU, ReLU6
    from layoutlab.nn.base import LayoutModule
    from layoutlab.nn.configuration import configure
    from layoutlab.nn.conv import Conv, ConvTranspose
    from layoutlab.nn.conv_settings import ConvSettings
    from layoutlab.nn.convert import convert_layout
    from layoutlab.nn.linear import Dense, Dropout, Flatten
    from layoutlab.nn.norm import BatchNorm, GroupNorm
    from layoutlab.nn.pooling import AdaptiveAvgPool, AvgPool, GlobalAvgPool, MaxPool
    from layoutlab.nn.upsample import Upsample

_EXPORTS = {
    "ReLU": "activation",
    "ReLU6": "activation",
    "LayoutModule": "base",
    "configure": "configuration",
    "Conv": "conv",
    "ConvTranspose": "conv",
    "ConvSettings": "conv_settings",
    "convert_layout": "convert",
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
    "AdaptiveAvgPool",
    "AvgPool",
    "BatchNorm",
    "Conv",
    "ConvSettings",
    "ConvTranspose",
    "Dense",
    "Dropout",
    "Flatten",
    "GlobalAvgPool",
    "GroupNorm",
    "LayoutModule",
    "MaxPool",
    "ReLU",
    "ReLU6",
    "Upsample",
    "configure",
    "convert_layout",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, lambda: set(globals()))
