"""A small CNN for 8x8 to 32x32 images (the default model for the built-in digits)."""

from __future__ import annotations

from layoutlab import nn
from layoutlab.models.base import ImageModel
from layoutlab.models.blocks import Sequential, conv_bn_act, layer_factories
from layoutlab.models.registration import POSITIVE, PROBABILITY, register

__all__ = ["SmallCNN"]


class SmallCNN(ImageModel):
    """conv-bn-relu x3 with a max pool, adaptive pool to 2x2, flatten, two dense layers."""

    def __init__(
        self,
        *,
        num_classes,
        layout,
        policy,
        rngs,
        in_channels=1,
        width=32,
        hidden=128,
        dropout=0.1,
        compute_layout=None,
    ):
        self.policy = policy
        layout = self._set_layouts(layout, compute_layout)  # the layers are built in it
        conv, norm = layer_factories(layout, policy, rngs)
        self.features = Sequential(
            conv_bn_act(conv, norm, in_channels, width, 3),
            conv_bn_act(conv, norm, width, 2 * width, 3),
            nn.MaxPool(2, 2, layout=layout, policy=policy),
            conv_bn_act(conv, norm, 2 * width, 2 * width, 3),
        )
        self.avgpool = nn.AdaptiveAvgPool(2, layout=layout, policy=policy)
        self.flatten = nn.Flatten(order="CHW", layout=layout, policy=policy)
        self.classifier = Sequential(
            nn.Dense(2 * width * 4, hidden, policy=policy, rngs=rngs),
            nn.ReLU(),
            nn.Dropout(dropout, rngs=rngs),
            nn.Dense(hidden, num_classes, policy=policy, rngs=rngs),
        )

    def forward(self, x):
        x = self.flatten(self.avgpool(self.features(x)))
        return self.policy.cast_to_output(self.classifier(x))


register(
    "small_cnn",
    description="small CNN (3 conv-bn-relu, max pool, flatten, 2 dense); the digits default",
    default_input=(8, 8, 1),
    tiny={"width": 4, "hidden": 16},
    ranges={n: POSITIVE for n in ("in_channels", "width", "hidden")} | {"dropout": PROBABILITY},
)(SmallCNN)
