"""The built-in models as ``layoutlab models`` lists them, without importing them.

Listing the registry would import every architecture (and with it flax and JAX); this table
lets ``layoutlab models`` answer at once. ``tests/cli/test_cli_fast_start.py`` checks it against
the registry, so it cannot drift.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["BUILTIN_MODELS", "CatalogEntry"]


class CatalogEntry(NamedTuple):
    name: str
    task: str
    num_spatial: int
    default_input: tuple[int, ...]
    description: str


BUILTIN_MODELS = (
    CatalogEntry(
        "mobilenet_v2",
        "classification",
        2,
        (32, 32, 3),
        "MobileNetV2 (inverted residuals, depthwise convs); width_mult scales it",
    ),
    CatalogEntry(
        "resnet18",
        "classification",
        2,
        (32, 32, 3),
        "ResNet-18 (BasicBlock x [2,2,2,2]); stem='imagenet'|'cifar'",
    ),
    CatalogEntry(
        "resnet34",
        "classification",
        2,
        (32, 32, 3),
        "ResNet-34 (BasicBlock x [3,4,6,3]); stem='imagenet'|'cifar'",
    ),
    CatalogEntry(
        "resnet50",
        "classification",
        2,
        (32, 32, 3),
        "ResNet-50 (Bottleneck x [3,4,6,3], stride on the 3x3); stem='imagenet'|'cifar'",
    ),
    CatalogEntry(
        "small_cnn",
        "classification",
        2,
        (8, 8, 1),
        "small CNN (3 conv-bn-relu, max pool, flatten, 2 dense); the digits default",
    ),
    CatalogEntry(
        "small_cnn3d",
        "classification",
        3,
        (8, 16, 16, 3),
        "small 3D CNN for clips (Conv3D, MaxPool3D, AvgPool3D)",
    ),
    CatalogEntry(
        "unet",
        "segmentation",
        2,
        (32, 32, 3),
        "small U-Net for segmentation (2 down, 2 up); up='transpose'|'bilinear'",
    ),
    CatalogEntry(
        "vgg11_bn",
        "classification",
        2,
        (32, 32, 3),
        "VGG-11 with BatchNorm; adaptive pool to pool_size, classifier width hidden",
    ),
)
