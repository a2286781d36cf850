"""ResNet-18/34/50 as torchvision defines them, with an ImageNet or a CIFAR stem."""

from __future__ import annotations

import functools

import jax
from flax import nnx

from layoutlab import nn
from layoutlab.models.base import ImageModel
from layoutlab.models.blocks import Sequential, layer_factories, run_block
from layoutlab.models.registration import POSITIVE, register
from layoutlab.nn.norm import batch_norm_relu

__all__ = ["BasicBlock", "Bottleneck", "ResNet"]


class BasicBlock(nnx.Module):
    expansion = 1

    def __init__(self, conv, norm, inplanes, planes, stride):
        self.conv1 = conv(inplanes, planes, 3, strides=stride, padding=1)
        self.bn1 = norm(planes)
        self.conv2 = conv(planes, planes, 3, padding=1)
        self.bn2 = norm(planes)
        self.downsample = _downsample(conv, norm, inplanes, planes * self.expansion, stride)

    def __call__(self, x):
        y = batch_norm_relu(self.bn1, self.conv1(x))
        y = self.bn2(self.conv2(y))
        shortcut = x if self.downsample is None else self.downsample(x)
        return jax.nn.relu(y + shortcut)


class Bottleneck(nnx.Module):
    """torchvision's ResNet v1.5: the stride sits on the 3x3 conv."""

    expansion = 4

    def __init__(self, conv, norm, inplanes, planes, stride):
        self.conv1 = conv(inplanes, planes, 1, padding=0)
        self.bn1 = norm(planes)
        self.conv2 = conv(planes, planes, 3, strides=stride, padding=1)
        self.bn2 = norm(planes)
        self.conv3 = conv(planes, planes * self.expansion, 1, padding=0)
        self.bn3 = norm(planes * self.expansion)
        self.downsample = _downsample(conv, norm, inplanes, planes * self.expansion, stride)

    def __call__(self, x):
        y = batch_norm_relu(self.bn1, self.conv1(x))
        y = batch_norm_relu(self.bn2, self.conv2(y))
        y = self.bn3(self.conv3(y))
        shortcut = x if self.downsample is None else self.downsample(x)
        return jax.nn.relu(y + shortcut)


def _downsample(conv, norm, cin, cout, stride):
    if stride == 1 and cin == cout:
        return None
    return Sequential(conv(cin, cout, 1, strides=stride, padding=0), norm(cout))


class ResNet(ImageModel):
    def __init__(
        self,
        block,
        stage_sizes,
        *,
        num_classes,
        layout,
        policy,
        rngs,
        stem="imagenet",
        in_channels=3,
        width=64,
        remat=False,
        compute_layout=None,
    ):
        if stem not in ("imagenet", "cifar"):
            raise ValueError(f"Unknown ResNet stem {stem!r}; use 'imagenet' or 'cifar'.")
        self.policy, self.stem, self.remat = policy, stem, remat
        layout = self._set_layouts(layout, compute_layout)  # the layers are built in it
        conv, norm = layer_factories(layout, policy, rngs)
        if stem == "imagenet":
            self.conv1 = conv(in_channels, width, 7, strides=2, padding=3)
            self.maxpool = nn.MaxPool(3, 2, 1, layout=layout, policy=policy)
        else:
            self.conv1 = conv(in_channels, width, 3, padding=1)
            self.maxpool = None
        self.bn1 = norm(width)
        inplanes = width
        stages = []
        for i, n in enumerate(stage_sizes):
            planes = width * 2**i
            blocks = []
            for j in range(n):
                stride = 2 if (i > 0 and j == 0) else 1
                blocks.append(block(conv, norm, inplanes, planes, stride))
                inplanes = planes * block.expansion
            stages.append(nnx.List(blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.GlobalAvgPool(layout=layout, policy=policy)
        self.fc = nn.Dense(inplanes, num_classes, policy=policy, rngs=rngs)

    def features(self, x):
        x = batch_norm_relu(self.bn1, self.conv1(x))
        if self.maxpool is not None:
            x = self.maxpool(x)
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            for blk in stage:
                x = run_block(blk, x, self.remat)
        return x

    def forward(self, x):
        logits = self.fc(self.avgpool(self.features(x)))
        return self.policy.cast_to_output(logits)


_CIFAR_TINY = {"width": 8, "stem": "cifar"}

_RANGES = {"in_channels": POSITIVE, "width": POSITIVE}
register(
    "resnet18",
    description="ResNet-18 (BasicBlock x [2,2,2,2]); stem='imagenet'|'cifar'",
    default_input=(32, 32, 3),
    tiny=_CIFAR_TINY,
    ranges=_RANGES,
)(functools.partial(ResNet, BasicBlock, (2, 2, 2, 2)))
register(
    "resnet34",
    description="ResNet-34 (BasicBlock x [3,4,6,3]); stem='imagenet'|'cifar'",
    default_input=(32, 32, 3),
    tiny=_CIFAR_TINY,
    ranges=_RANGES,
)(functools.partial(ResNet, BasicBlock, (3, 4, 6, 3)))
register(
    "resnet50",
    description="ResNet-50 (Bottleneck x [3,4,6,3], stride on the 3x3); stem='imagenet'|'cifar'",
    default_input=(32, 32, 3),
    tiny=_CIFAR_TINY,
    ranges=_RANGES,
)(functools.partial(ResNet, Bottleneck, (3, 4, 6, 3)))
