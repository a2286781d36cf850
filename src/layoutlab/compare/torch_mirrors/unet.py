"""layoutlab's ``unet`` (transpose-conv or bilinear up-sampling), mirrored module for module."""

from __future__ import annotations

import torch
from torch import nn

from layoutlab.compare.torch_mirrors.blocks import Conv2dNormActivation

__all__ = ["UNet", "Up"]


def _double_conv(cin, cout):
    return nn.Sequential(Conv2dNormActivation(cin, cout, 3), Conv2dNormActivation(cout, cout, 3))


class Up(nn.Module):
    def __init__(self, cin, cout, mode):
        super().__init__()
        if mode == "transpose":
            self.up = nn.ConvTranspose2d(cin, cout, 2, stride=2)
        elif mode == "bilinear":
            self.up = nn.Sequential(
                nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
                nn.Conv2d(cin, cout, 1, bias=False),
            )
        else:
            raise ValueError(f"Unknown U-Net up-sampling {mode!r}; use 'transpose' or 'bilinear'.")
        self.conv = _double_conv(2 * cout, cout)

    def forward(self, x, skip):
        return self.conv(torch.cat([skip, self.up(x)], dim=1))


class UNet(nn.Module):
    def __init__(self, num_classes=10, *, in_channels=3, width=16, up="transpose"):
        super().__init__()
        w = width
        self.enc1 = _double_conv(in_channels, w)
        self.enc2 = _double_conv(w, 2 * w)
        self.bottleneck = _double_conv(2 * w, 4 * w)
        self.pool = nn.MaxPool2d(2, 2)
        self.up2 = Up(4 * w, 2 * w, up)
        self.up1 = Up(2 * w, w, up)
        self.head = nn.Conv2d(w, num_classes, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        b = self.bottleneck(self.pool(e2))
        return self.head(self.up1(self.up2(b, e2), e1))
