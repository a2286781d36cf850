"""A small U-Net: two down-sampling and two up-sampling stages with skip connections."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from layoutlab import nn
from layoutlab.models.base import ImageModel
from layoutlab.models.blocks import Sequential, conv_bn_act, layer_factories
from layoutlab.models.registration import register

__all__ = ["UNet", "Up", "double_conv"]


def double_conv(conv, norm, cin, cout):
    return Sequential(conv_bn_act(conv, norm, cin, cout, 3), conv_bn_act(conv, norm, cout, cout, 3))


class Up(nnx.Module):
    """Up-sample by 2 (transposed conv, or bilinear + 1x1 conv), concat the skip, convs."""

    def __init__(self, conv, norm, cin, cout, *, mode, layout, policy, rngs):
        self.layout = layout
        if mode == "transpose":
            self.up = nn.ConvTranspose(
                cin, cout, 2, strides=2, layout=layout, policy=policy, rngs=rngs
            )
        elif mode == "bilinear":
            self.up = Sequential(
                nn.Upsample(2, method="bilinear", layout=layout, policy=policy),
                conv(cin, cout, 1, padding=0),
            )
        else:
            raise ValueError(f"Unknown U-Net up-sampling {mode!r}; use 'transpose' or 'bilinear'.")
        self.conv = double_conv(conv, norm, 2 * cout, cout)

    def __call__(self, x, skip):
        x = self.up(x)
        return self.conv(jnp.concatenate([skip, x], axis=self.layout.channel_axis))


class UNet(ImageModel):
    """Per-pixel logits ``(N, num_classes, H, W)`` in the model's layout; H, W divisible by 4."""

    def __init__(
        self,
        *,
        num_classes,
        layout,
        policy,
        rngs,
        in_channels=3,
        width=16,
        up="transpose",
        compute_layout=None,
    ):
        self.policy = policy
        layout = self._set_layouts(layout, compute_layout)  # the layers are built in it
        conv, norm = layer_factories(layout, policy, rngs)
        w = width
        self.enc1 = double_conv(conv, norm, in_channels, w)
        self.enc2 = double_conv(conv, norm, w, 2 * w)
        self.bottleneck = double_conv(conv, norm, 2 * w, 4 * w)
        self.pool = nn.MaxPool(2, 2, layout=layout, policy=policy)
        kw = dict(mode=up, layout=layout, policy=policy, rngs=rngs)
        self.up2 = Up(conv, norm, 4 * w, 2 * w, **kw)
        self.up1 = Up(conv, norm, 2 * w, w, **kw)
        self.head = nn.Conv(w, num_classes, 1, padding=0, layout=layout, policy=policy, rngs=rngs)

    def forward(self, x):
        spatial = self.compute_layout.spatial_shape(x.shape)
        if any(s % 4 for s in spatial):
            raise ValueError(f"UNet needs spatial sizes divisible by 4, got {spatial}.")
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        b = self.bottleneck(self.pool(e2))
        y = self.up1(self.up2(b, e2), e1)
        return self.policy.cast_to_output(self.head(y))


register(
    "unet",
    description="small U-Net for segmentation (2 down, 2 up); up='transpose'|'bilinear'",
    task="segmentation",
    default_input=(32, 32, 3),
    tiny={"width": 4},
)(UNet)
