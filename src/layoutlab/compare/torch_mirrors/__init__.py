"""PyTorch twins of every registry model, for numerics comparison with the same weights.

``resnet18/34/50``, ``vgg11_bn`` and ``mobilenet_v2`` repeat torchvision's module names and
structure (``conv1``, ``layer1.0.downsample.0``, ``features.1.conv.0.0``, ...), so their
``state_dict`` keys are torchvision's and torchvision checkpoints load into the layoutlab
models. torchvision itself is not needed. The other models mirror layoutlab's own module
tree. Every builder takes the same architecture keywords as ``layoutlab.models.create``.
One module per model family, as in ``layoutlab.models``; running a mirror layer by layer is
``layoutlab.compare.torch_layerwise``.

Needs the optional PyTorch extra: ``pip install 'layoutlab[torch]'``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from layoutlab.compare.torch_weights import require_torch

# Before the family modules import torch, so that a missing torch says how to install it.
require_torch()
from torch import nn  # noqa: E402

from layoutlab.compare.torch_mirrors.cnn3d import SmallCNN3D  # noqa: E402
from layoutlab.compare.torch_mirrors.mobilenet import MobileNetV2  # noqa: E402
from layoutlab.compare.torch_mirrors.resnet import BasicBlock, Bottleneck, ResNet  # noqa: E402
from layoutlab.compare.torch_mirrors.small_cnn import SmallCNN  # noqa: E402
from layoutlab.compare.torch_mirrors.unet import UNet  # noqa: E402
from layoutlab.compare.torch_mirrors.vgg import VGG  # noqa: E402

__all__ = ["MIRRORS", "build_torch_mirror"]


def _resnet(block, layers):
    return lambda num_classes, **kw: ResNet(block, layers, num_classes, **kw)


MIRRORS: dict[str, Callable[..., nn.Module]] = {
    "resnet18": _resnet(BasicBlock, (2, 2, 2, 2)),
    "resnet34": _resnet(BasicBlock, (3, 4, 6, 3)),
    "resnet50": _resnet(Bottleneck, (3, 4, 6, 3)),
    "vgg11_bn": VGG,
    "mobilenet_v2": MobileNetV2,
    "small_cnn": SmallCNN,
    "small_cnn3d": SmallCNN3D,
    "unet": UNet,
}

_CLASSES = {
    "resnet18": ResNet,
    "resnet34": ResNet,
    "resnet50": ResNet,
    "vgg11_bn": VGG,
    "mobilenet_v2": MobileNetV2,
    "small_cnn": SmallCNN,
    "small_cnn3d": SmallCNN3D,
    "unet": UNet,
}


def build_torch_mirror(name: str, *, num_classes: int = 10, **kw) -> nn.Module:
    """The PyTorch twin of registry model ``name``, built with the same keywords as
    ``layoutlab.models.create(name, num_classes=..., **kw)`` (layout/policy/rngs aside)."""
    key = name.strip().lower()
    if key not in MIRRORS:
        raise ValueError(
            f"No PyTorch mirror for {name!r}; mirrors exist for: {', '.join(MIRRORS)}."
        )
    accepted = [
        p
        for p in inspect.signature(_CLASSES[key].__init__).parameters
        if p not in ("self", "block", "layers", "num_classes")
    ]
    unknown = sorted(set(kw) - set(accepted))
    if unknown:
        raise ValueError(
            f"The {key} mirror got unknown options {unknown}; it accepts: {', '.join(accepted)}."
        )
    return MIRRORS[key](num_classes, **kw)
