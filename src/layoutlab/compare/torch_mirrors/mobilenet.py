"""torchvision's MobileNetV2, module for module."""

from __future__ import annotations

import torch
from torch import nn

from layoutlab.compare.torch_mirrors.blocks import Conv2dNormActivation

# The model's own stage table: the mirror has exactly the model's stages.
from layoutlab.models.mobilenet import INVERTED_RESIDUAL_SETTINGS, make_divisible

__all__ = ["InvertedResidual", "MobileNetV2"]


class InvertedResidual(nn.Module):
    def __init__(self, inp, oup, stride, expand_ratio):
        super().__init__()
        hidden_dim = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(
                Conv2dNormActivation(inp, hidden_dim, kernel_size=1, activation_layer=nn.ReLU6)
            )
        layers += [
            Conv2dNormActivation(
                hidden_dim, hidden_dim, stride=stride, groups=hidden_dim, activation_layer=nn.ReLU6
            ),
            nn.Conv2d(hidden_dim, oup, 1, 1, 0, bias=False),
            nn.BatchNorm2d(oup),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision.models.MobileNetV2 (``last_channel`` adjustable)."""

    def __init__(
        self,
        num_classes=1000,
        *,
        in_channels=3,
        width_mult=1.0,
        last_channel=1280,
        dropout=0.2,
        remat=False,
    ):
        super().__init__()
        del remat
        cin = make_divisible(32 * width_mult)
        self.last_channel = make_divisible(last_channel * max(1.0, width_mult))
        features: list[nn.Module] = [
            Conv2dNormActivation(in_channels, cin, stride=2, activation_layer=nn.ReLU6)
        ]
        for t, c, n, s in INVERTED_RESIDUAL_SETTINGS:
            cout = make_divisible(c * width_mult)
            for i in range(n):
                features.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        features.append(
            Conv2dNormActivation(cin, self.last_channel, kernel_size=1, activation_layer=nn.ReLU6)
        )
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout), nn.Linear(self.last_channel, num_classes)
        )

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))
