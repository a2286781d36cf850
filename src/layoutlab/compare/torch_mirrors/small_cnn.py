"""layoutlab's ``small_cnn``, mirrored module for module."""

from __future__ import annotations

from torch import nn

from layoutlab.compare.torch_mirrors.blocks import Conv2dNormActivation

__all__ = ["SmallCNN"]


class SmallCNN(nn.Module):
    def __init__(self, num_classes=10, *, in_channels=1, width=32, hidden=128, dropout=0.1):
        super().__init__()
        self.features = nn.Sequential(
            Conv2dNormActivation(in_channels, width, 3),
            Conv2dNormActivation(width, 2 * width, 3),
            nn.MaxPool2d(2, 2),
            Conv2dNormActivation(2 * width, 2 * width, 3),
        )
        self.avgpool = nn.AdaptiveAvgPool2d(2)
        self.flatten = nn.Flatten()
        self.classifier = nn.Sequential(
            nn.Linear(2 * width * 4, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        return self.classifier(self.flatten(self.avgpool(self.features(x))))
