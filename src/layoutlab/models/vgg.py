"""VGG-11 with BatchNorm, as torchvision defines it (``vgg11_bn``)."""

from __future__ import annotations

from layoutlab import nn
from layoutlab.models.base import ImageModel
from layoutlab.models.blocks import Sequential
from layoutlab.models.registration import POSITIVE, PROBABILITY, register

__all__ = ["VGG"]


_VGG11 = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


class VGG(ImageModel):
    """``features`` and ``classifier`` index their layers as torchvision's Sequentials do."""

    def __init__(
        self,
        cfg=_VGG11,
        *,
        num_classes,
        layout,
        policy,
        rngs,
        in_channels=3,
        width=64,
        hidden=4096,
        pool_size=7,
        dropout=0.5,
        compute_layout=None,
    ):
        self.policy = policy
        layout = self._set_layouts(layout, compute_layout)  # the layers are built in it
        layers = []
        cin = in_channels
        for item in cfg:
            if item == "M":
                layers.append(nn.MaxPool(2, 2, layout=layout, policy=policy))
                continue
            cout = item * width // 64
            layers += [
                nn.Conv(cin, cout, 3, padding=1, layout=layout, policy=policy, rngs=rngs),
                nn.BatchNorm(cout, layout=layout, policy=policy),
                nn.ReLU(),
            ]
            cin = cout
        self.features = Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool(pool_size, layout=layout, policy=policy)
        self.flatten = nn.Flatten(order="CHW", layout=layout, policy=policy)
        self.classifier = Sequential(
            nn.Dense(cin * pool_size * pool_size, hidden, policy=policy, rngs=rngs),
            nn.ReLU(),
            nn.Dropout(dropout, rngs=rngs),
            nn.Dense(hidden, hidden, policy=policy, rngs=rngs),
            nn.ReLU(),
            nn.Dropout(dropout, rngs=rngs),
            nn.Dense(hidden, num_classes, policy=policy, rngs=rngs),
        )

    def forward(self, x):
        x = self.flatten(self.avgpool(self.features(x)))
        return self.policy.cast_to_output(self.classifier(x))


register(
    "vgg11_bn",
    description="VGG-11 with BatchNorm; adaptive pool to pool_size, classifier width hidden",
    default_input=(32, 32, 3),
    tiny={"width": 8, "hidden": 32, "pool_size": 2},
    ranges={n: POSITIVE for n in ("in_channels", "width", "hidden", "pool_size")}
    | {"dropout": PROBABILITY},
)(VGG)
