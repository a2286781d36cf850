"""MobileNetV2 as torchvision defines it (inverted residuals, depthwise 3x3 convs)."""

from __future__ import annotations

from flax import nnx

from layoutlab import nn
from layoutlab.models.base import ImageModel
from layoutlab.models.blocks import Sequential, conv_bn_act, layer_factories, run_block
from layoutlab.models.registration import POSITIVE, PROBABILITY, Range, register

__all__ = ["INVERTED_RESIDUAL_SETTINGS", "InvertedResidual", "MobileNetV2", "make_divisible"]


# (expansion t, channels c, repeats n, first stride s)
INVERTED_RESIDUAL_SETTINGS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def make_divisible(v: float, divisor: int = 8) -> int:
    """torchvision's ``_make_divisible``: round to a multiple, never dropping below 90%."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class InvertedResidual(nnx.Module):
    def __init__(self, conv, norm, inp, oup, stride, expand_ratio):
        hidden = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers = []
        if expand_ratio != 1:
            layers.append(conv_bn_act(conv, norm, inp, hidden, 1, act=nn.ReLU6))
        layers += [
            conv_bn_act(conv, norm, hidden, hidden, 3, stride=stride, groups=hidden, act=nn.ReLU6),
            conv(hidden, oup, 1, padding=0),
            norm(oup),
        ]
        self.conv = Sequential(*layers)

    def __call__(self, x):
        y = self.conv(x)
        return x + y if self.use_res_connect else y


class MobileNetV2(ImageModel):
    def __init__(
        self,
        *,
        num_classes,
        layout,
        policy,
        rngs,
        in_channels=3,
        width_mult=1.0,
        last_channel=1280,
        dropout=0.2,
        remat=False,
        compute_layout=None,
    ):
        self.policy, self.remat = policy, remat
        layout = self._set_layouts(layout, compute_layout)  # the layers are built in it
        conv, norm = layer_factories(layout, policy, rngs)
        cin = make_divisible(32 * width_mult)
        self.last_channel = make_divisible(last_channel * max(1.0, width_mult))
        layers = [conv_bn_act(conv, norm, in_channels, cin, 3, stride=2, act=nn.ReLU6)]
        for t, c, n, s in INVERTED_RESIDUAL_SETTINGS:
            cout = make_divisible(c * width_mult)
            for i in range(n):
                layers.append(InvertedResidual(conv, norm, cin, cout, s if i == 0 else 1, t))
                cin = cout
        layers.append(conv_bn_act(conv, norm, cin, self.last_channel, 1, act=nn.ReLU6))
        self.features = Sequential(*layers)
        self.avgpool = nn.GlobalAvgPool(layout=layout, policy=policy)
        self.classifier = Sequential(
            nn.Dropout(dropout, rngs=rngs),
            nn.Dense(self.last_channel, num_classes, policy=policy, rngs=rngs),
        )

    def forward(self, x):
        for layer in self.features:
            x = run_block(layer, x, self.remat)
        return self.policy.cast_to_output(self.classifier(self.avgpool(x)))


register(
    "mobilenet_v2",
    description="MobileNetV2 (inverted residuals, depthwise convs); width_mult scales it",
    default_input=(32, 32, 3),
    tiny={"width_mult": 0.25, "last_channel": 64},
    ranges={
        "in_channels": POSITIVE,
        "last_channel": POSITIVE,
        "width_mult": Range(0.0, low_open=True),
        "dropout": PROBABILITY,
    },
)(MobileNetV2)
