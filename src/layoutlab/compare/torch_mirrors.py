"""PyTorch twins of every registry model, for numerics comparison with the same weights.

``resnet18/34/50``, ``vgg11_bn`` and ``mobilenet_v2`` repeat torchvision's module names and
structure (``conv1``, ``layer1.0.downsample.0``, ``features.1.conv.0.0``, ...), so their
``state_dict`` keys are torchvision's and torchvision checkpoints load into the layoutlab
models. torchvision itself is not needed. The other models mirror layoutlab's own module
tree. Every builder takes the same architecture keywords as ``layoutlab.models.create``.

Needs the optional PyTorch extra: ``pip install 'layoutlab[torch]'``.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from layoutlab.compare.layerwise import LayerOutput
from layoutlab.compare.torch_weights import require_torch
from layoutlab.models.mobilenet import make_divisible

torch = require_torch()
from torch import nn  # noqa: E402

__all__ = [
    "MIRRORS",
    "TORCH_PRECISION",
    "build_torch_mirror",
    "pinned_torch_precision",
    "set_torch_mode",
    "torch_layer_outputs",
    "torch_grads",
]


TORCH_PRECISION = {
    "torch_float32_matmul_precision": "highest",
    "torch_cudnn_allow_tf32": False,
    "torch_cuda_matmul_allow_tf32": False,
}


@contextlib.contextmanager
def pinned_torch_precision() -> Iterator[dict]:
    """Full float32 matmuls and convs in PyTorch (no TF32), restored afterwards."""
    saved = (
        torch.backends.cudnn.allow_tf32,
        torch.backends.cuda.matmul.allow_tf32,
        torch.get_float32_matmul_precision(),
    )
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield dict(TORCH_PRECISION)
    finally:
        torch.backends.cudnn.allow_tf32 = saved[0]
        torch.backends.cuda.matmul.allow_tf32 = saved[1]
        torch.set_float32_matmul_precision(saved[2])


def set_torch_mode(module: nn.Module, train: bool) -> nn.Module:
    """Train mode (batch statistics) or eval mode, with dropout off in both."""
    module.train(train)
    for m in module.modules():
        if isinstance(m, nn.Dropout | nn.Dropout2d | nn.Dropout3d):
            m.eval()
    return module


# --------------------------------------------------------------------------- torchvision


class Conv2dNormActivation(nn.Sequential):
    """torchvision.ops.Conv2dNormActivation: conv (no bias), BatchNorm, activation."""

    def __init__(
        self, cin, cout, kernel_size=3, stride=1, groups=1, activation_layer=nn.ReLU, dims=2
    ):
        conv = (nn.Conv2d, nn.Conv3d)[dims - 2]
        norm = (nn.BatchNorm2d, nn.BatchNorm3d)[dims - 2]
        super().__init__(
            conv(cin, cout, kernel_size, stride, (kernel_size - 1) // 2, groups=groups, bias=False),
            norm(cout),
            activation_layer(inplace=True),
        )


def conv3x3(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def conv1x1(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision.models.ResNet; ``stem="cifar"`` swaps the 7x7/2 conv and max pool for a
    3x3/1 conv (the max pool becomes ``Identity``), ``width`` scales every stage."""

    def __init__(
        self,
        block,
        layers,
        num_classes=1000,
        *,
        stem="imagenet",
        in_channels=3,
        width=64,
        remat=False,
    ):
        super().__init__()
        del remat  # a memory option of the JAX model; no numerical effect
        if stem not in ("imagenet", "cifar"):
            raise ValueError(f"Unknown ResNet stem {stem!r}; use 'imagenet' or 'cifar'.")
        self.inplanes = width
        if stem == "imagenet":
            self.conv1 = nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        else:
            self.conv1 = nn.Conv2d(in_channels, width, 3, stride=1, padding=1, bias=False)
            self.maxpool = nn.Identity()
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(block, width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(block, width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8 * block.expansion, num_classes)

    def _make_layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * block.expansion, stride),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


_VGG11 = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


class VGG(nn.Module):
    """torchvision.models.vgg11_bn with ``width``/``hidden``/``pool_size`` scaling."""

    def __init__(
        self,
        num_classes=1000,
        *,
        cfg=_VGG11,
        in_channels=3,
        width=64,
        hidden=4096,
        pool_size=7,
        dropout=0.5,
    ):
        super().__init__()
        layers: list[nn.Module] = []
        cin = in_channels
        for item in cfg:
            if item == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
                continue
            cout = item * width // 64
            layers += [
                nn.Conv2d(cin, cout, 3, padding=1),
                nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True),
            ]
            cin = cout
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((pool_size, pool_size))
        self.classifier = nn.Sequential(
            nn.Linear(cin * pool_size * pool_size, hidden),
            nn.ReLU(True),
            nn.Dropout(p=dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(True),
            nn.Dropout(p=dropout),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


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


_MOBILENET_SETTINGS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


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
        for t, c, n, s in _MOBILENET_SETTINGS:
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


# --------------------------------------------------------------------------- layoutlab's own


class GlobalAvgPool(nn.Module):
    """Mean over the spatial dims to ``(N, C)``, like ``layoutlab.nn.GlobalAvgPool``."""

    def forward(self, x):
        return x.mean(dim=tuple(range(2, x.dim())))


class SmallCNN(nn.Module):
    def __init__(self, num_classes=10, *, in_channels=1, width=32, hidden=128, dropout=0.1):
        super().__init__()
        self.features = nn.Sequential(
            Conv2dNormActivation(in_channels, width, 3),
            Conv2dNormActivation(width, 2 * width, 3),
            nn.MaxPool2d(2, 2),
            Conv2dNormActivation(2 * width, 2 * width, 3),
        )
        self.avgpool = nn.AdaptiveAvgPool2d(2)
        self.flatten = nn.Flatten()
        self.classifier = nn.Sequential(
            nn.Linear(2 * width * 4, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        return self.classifier(self.flatten(self.avgpool(self.features(x))))


class SmallCNN3D(nn.Module):
    def __init__(self, num_classes=10, *, in_channels=3, width=16):
        super().__init__()
        self.features = nn.Sequential(
            Conv2dNormActivation(in_channels, width, 3, dims=3),
            nn.MaxPool3d(2, 2),
            Conv2dNormActivation(width, 2 * width, 3, dims=3),
            nn.AvgPool3d(2, 2),
        )
        self.avgpool = GlobalAvgPool()
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x):
        return self.fc(self.avgpool(self.features(x)))


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


# --------------------------------------------------------------------------- registry


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


# --------------------------------------------------------------------------- running


def _tensor(x: Any):
    return torch.from_numpy(np.ascontiguousarray(np.asarray(x, np.float32)))


def _numpy(t) -> np.ndarray:
    return t.detach().cpu().float().numpy().copy()


def torch_layer_outputs(
    mirror: nn.Module, x: Any, *, train: bool = False, include_containers: bool = False
) -> tuple[np.ndarray, list[LayerOutput]]:
    """``(output, layer outputs)`` of ``mirror`` on channels-first ``x``, recorded with
    forward hooks on its leaf modules (every module with ``include_containers``), named by
    ``named_modules()``; repeated calls of one module are numbered ``name#2``, ...

    ``mirror`` itself is not changed: a train-mode pass runs on a copy, so its running
    statistics stay put, as on the JAX side.
    """
    module = set_torch_mode(copy.deepcopy(mirror) if train else mirror, train)
    records: list[LayerOutput] = []
    calls: dict[str, int] = {}

    def hook(name: str, op: str):
        def fn(_mod, _inputs, output):
            if not isinstance(output, torch.Tensor):
                return
            n = calls.get(name, 0) + 1
            calls[name] = n
            # A copy: an in-place ReLU after this layer would overwrite the tensor.
            records.append(LayerOutput(name if n == 1 else f"{name}#{n}", op, _numpy(output)))

        return fn

    handles = [
        mod.register_forward_hook(hook(name, type(mod).__name__))
        for name, mod in module.named_modules()
        if name and (include_containers or not any(True for _ in mod.children()))
    ]
    try:
        with pinned_torch_precision(), torch.no_grad():
            out = module(_tensor(x))
    finally:
        for h in handles:
            h.remove()
    return _numpy(out), records


def torch_grads(
    mirror: nn.Module, x: Any, labels: Any, *, train: bool = True
) -> tuple[float, dict[str, np.ndarray]]:
    """``(loss, {parameter name: gradient})`` of the mean cross-entropy of ``mirror``'s
    logits (class axis 1) against integer ``labels``, computed on a copy of ``mirror``."""
    module = set_torch_mode(copy.deepcopy(mirror), train)
    module.zero_grad(set_to_none=True)
    with pinned_torch_precision():
        logits = module(_tensor(x))
        loss = nn.functional.cross_entropy(
            logits.float(), torch.from_numpy(np.asarray(labels, np.int64))
        )
        loss.backward()
    grads = {
        name: _numpy(p.grad) if p.grad is not None else np.zeros(tuple(p.shape), np.float32)
        for name, p in module.named_parameters()
    }
    return float(loss.detach()), grads
