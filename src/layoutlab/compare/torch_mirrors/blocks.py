"""Layers the mirrors share: torchvision's ``Conv2dNormActivation`` and a global average pool
like ``layoutlab.nn.GlobalAvgPool``."""

from __future__ import annotations

from torch import nn

__all__ = ["Conv2dNormActivation", "GlobalAvgPool"]


class Conv2dNormActivation(nn.Sequential):
    """torchvision.ops.Conv2dNormActivation: conv (no bias), BatchNorm, activation."""

    def __init__(
        self, cin, cout, kernel_size=3, stride=1, groups=1, activation_layer=nn.ReLU, dims=2
    ):
        conv = (nn.Conv2d, nn.Conv3d)[dims - 2]
        norm = (nn.BatchNorm2d, nn.BatchNorm3d)[dims - 2]
        super().__init__(
            conv(cin, cout, kernel_size, stride, (kernel_size - 1) // 2, groups=groups, bias=False),
            norm(cout),
            activation_layer(inplace=True),
        )


class GlobalAvgPool(nn.Module):
    """Mean over the spatial dims to ``(N, C)``, like ``layoutlab.nn.GlobalAvgPool``."""

    def forward(self, x):
        return x.mean(dim=tuple(range(2, x.dim())))
