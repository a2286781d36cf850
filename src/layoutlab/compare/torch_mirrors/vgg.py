"""torchvision's ``vgg11_bn``, module for module."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["VGG"]


_VGG11 = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


class VGG(nn.Module):
    """torchvision.models.vgg11_bn with ``width``/``hidden``/``pool_size`` scaling."""

    def __init__(
        self,
        num_classes=1000,
        *,
        cfg=_VGG11,
        in_channels=3,
        width=64,
        hidden=4096,
        pool_size=7,
        dropout=0.5,
    ):
        super().__init__()
        layers: list[nn.Module] = []
        cin = in_channels
        for item in cfg:
            if item == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
                continue
            cout = item * width // 64
            layers += [
                nn.Conv2d(cin, cout, 3, padding=1),
                nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True),
            ]
            cin = cout
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((pool_size, pool_size))
        self.classifier = nn.Sequential(
            nn.Linear(cin * pool_size * pool_size, hidden),
            nn.ReLU(True),
            nn.Dropout(p=dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(True),
            nn.Dropout(p=dropout),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))
