"""layoutlab's ``small_cnn3d``, mirrored module for module."""

from __future__ import annotations

from torch import nn

from layoutlab.compare.torch_mirrors.blocks import Conv2dNormActivation, GlobalAvgPool

__all__ = ["SmallCNN3D"]


class SmallCNN3D(nn.Module):
    def __init__(self, num_classes=10, *, in_channels=3, width=16):
        super().__init__()
        self.features = nn.Sequential(
            Conv2dNormActivation(in_channels, width, 3, dims=3),
            nn.MaxPool3d(2, 2),
            Conv2dNormActivation(width, 2 * width, 3, dims=3),
            nn.AvgPool3d(2, 2),
        )
        self.avgpool = GlobalAvgPool()
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x):
        return self.fc(self.avgpool(self.features(x)))
