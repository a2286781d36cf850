"""A small 3D CNN for clips: Conv3D, MaxPool3D and AvgPool3D in NDHWC or NCDHW."""

from __future__ import annotations

from layoutlab import nn
from layoutlab.models.base import ImageModel
from layoutlab.models.blocks import Sequential, conv_bn_act, layer_factories
from layoutlab.models.registration import register

__all__ = ["SmallCNN3D"]


class SmallCNN3D(ImageModel):
    def __init__(
        self, *, num_classes, layout, policy, rngs, in_channels=3, width=16, compute_layout=None
    ):
        self.policy = policy
        layout = self._set_layouts(layout, compute_layout)  # the layers are built in it
        conv, norm = layer_factories(layout, policy, rngs)
        self.features = Sequential(
            conv_bn_act(conv, norm, in_channels, width, 3),
            nn.MaxPool(2, 2, layout=layout, policy=policy),
            conv_bn_act(conv, norm, width, 2 * width, 3),
            nn.AvgPool(2, 2, layout=layout, policy=policy),
        )
        self.avgpool = nn.GlobalAvgPool(layout=layout, policy=policy)
        self.fc = nn.Dense(2 * width, num_classes, policy=policy, rngs=rngs)

    def forward(self, x):
        return self.policy.cast_to_output(self.fc(self.avgpool(self.features(x))))


register(
    "small_cnn3d",
    description="small 3D CNN for clips (Conv3D, MaxPool3D, AvgPool3D)",
    num_spatial=3,
    default_input=(8, 16, 16, 3),
    tiny={"width": 4},
)(SmallCNN3D)
