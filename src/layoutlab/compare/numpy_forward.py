"""A float64 NumPy forward pass of the registry models, layer by layer, with no JAX ops.

Each layer is computed by the matching ``layoutlab.compare.numpy_ref`` function from the
layer's weights and hyperparameters; each architecture's wiring (residuals, skips) is
written out again here. The result is an independent reference that shares only the
weights with the model, recorded with the same layer paths as ``layer_recording.layer_outputs``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from flax import nnx

from layoutlab import nn
from layoutlab.compare import numpy_ref as ref
from layoutlab.compare.layer_recording import LayerOutput, LayerRecorder, module_paths
from layoutlab.compare.torch_weights import stored_kernel_layout
from layoutlab.layout import convert_kernel
from layoutlab.models import cnn3d, mobilenet, resnet, small_cnn, unet, vgg
from layoutlab.models.blocks import Sequential
from layoutlab.nn.configuration import in_own_layout

__all__ = ["numpy_forward", "supported_types"]


def _w(variable: Any) -> np.ndarray | None:
    if variable is None:
        return None
    return np.asarray(variable.get_value(), np.float64)


def _padding(padding: Any) -> Any:
    return padding if isinstance(padding, str) else [tuple(p) for p in padding]


class _Walker:
    def __init__(self, model: nnx.Module, train: bool):
        self.train = train
        self.recorder = LayerRecorder(module_paths(model))

    def __call__(self, module: Any, x: np.ndarray, *args) -> np.ndarray:
        for cls in type(module).__mro__:
            handler = _HANDLERS.get(cls)
            if handler is not None:
                out = handler(self, module, x, *args)
                self.recorder.add(module, out)
                return out
        raise ValueError(
            f"No float64 NumPy reference for {type(module).__name__}; supported: "
            f"{', '.join(sorted(t.__name__ for t in _HANDLERS))}."
        )


# --------------------------------------------------------------------------- layers


def _conv(w, m: nn.Conv, x):
    # numpy_ref takes the kernel in the layout's order; a conv may store it channels-last.
    kernel = np.asarray(convert_kernel(_w(m.kernel), stored_kernel_layout(m), m.layout))
    return ref.conv(
        x,
        kernel,
        _w(m.bias),
        strides=m.strides,
        padding=_padding(m.padding),
        dilation=m.dilation,
        groups=m.groups,
        layout=m.layout,
    )


def _conv_transpose(w, m: nn.ConvTranspose, x):
    return ref.conv_transpose(
        x,
        _w(m.kernel),
        _w(m.bias),
        strides=m.strides,
        padding=m.padding,
        output_padding=m.output_padding,
        dilation=m.dilation,
        layout=m.layout,
    )


def _batch_norm(w, m: nn.BatchNorm, x):
    stats = {} if w.train else {"mean": _w(m.mean), "var": _w(m.var)}
    return ref.batch_norm(x, _w(m.scale), _w(m.bias), eps=m.epsilon, layout=m.layout, **stats)


def _group_norm(w, m: nn.GroupNorm, x):
    return ref.group_norm(x, m.num_groups, _w(m.scale), _w(m.bias), eps=m.epsilon, layout=m.layout)


def _max_pool(w, m: nn.MaxPool, x):
    return ref.max_pool(x, m.kernel_size, m.strides, _padding(m.padding), layout=m.layout)


def _avg_pool(w, m: nn.AvgPool, x):
    return ref.avg_pool(
        x, m.kernel_size, m.strides, _padding(m.padding), m.count_include_pad, layout=m.layout
    )


def _adaptive(w, m: nn.AdaptiveAvgPool, x):
    return ref.adaptive_avg_pool(x, m.output_size, m.layout)


def _global(w, m: nn.GlobalAvgPool, x):
    y = ref.global_avg_pool(x, m.layout)
    if m.keepdims:
        shape = [1] * m.layout.rank
        shape[0], shape[m.layout.channel_axis] = y.shape
        y = y.reshape(shape)
    return y


def _upsample(w, m: nn.Upsample, x):
    if m.method == "nearest":
        return ref.upsample_nearest(x, m.scale_factor, m.layout)
    return ref.upsample_bilinear(x, m.scale_factor, m.align_corners, layout=m.layout)


def _dense(w, m: nn.Dense, x):
    return ref.dense(x, _w(m.kernel), _w(m.bias))


def _flatten(w, m: nn.Flatten, x):
    return ref.flatten(x, m.layout, m.order)


def _relu6(w, m, x):
    return np.clip(ref.relu(x), 0.0, 6.0)


# --------------------------------------------------------------------------- wiring


def _sequential(w, m: Sequential, x):
    for layer in m.layers:
        x = w(layer, x)
    return x


def _basic_block(w, m: resnet.BasicBlock, x):
    y = ref.relu(w(m.bn1, w(m.conv1, x)))
    y = w(m.bn2, w(m.conv2, y))
    shortcut = x if m.downsample is None else w(m.downsample, x)
    return ref.relu(y + shortcut)


def _bottleneck(w, m: resnet.Bottleneck, x):
    y = ref.relu(w(m.bn1, w(m.conv1, x)))
    y = ref.relu(w(m.bn2, w(m.conv2, y)))
    y = w(m.bn3, w(m.conv3, y))
    shortcut = x if m.downsample is None else w(m.downsample, x)
    return ref.relu(y + shortcut)


def _resnet(w, m: resnet.ResNet, x):
    x = ref.relu(w(m.bn1, w(m.conv1, x)))
    if m.maxpool is not None:
        x = w(m.maxpool, x)
    for stage in (m.layer1, m.layer2, m.layer3, m.layer4):
        for block in stage:
            x = w(block, x)
    return w(m.fc, w(m.avgpool, x))


def _inverted_residual(w, m: mobilenet.InvertedResidual, x):
    y = w(m.conv, x)
    return x + y if m.use_res_connect else y


def _mobilenet(w, m: mobilenet.MobileNetV2, x):
    for layer in m.features.layers:
        x = w(layer, x)
    return w(m.classifier, w(m.avgpool, x))


def _pool_flatten_classify(w, m, x):
    return w(m.classifier, w(m.flatten, w(m.avgpool, w(m.features, x))))


def _cnn3d(w, m: cnn3d.SmallCNN3D, x):
    return w(m.fc, w(m.avgpool, w(m.features, x)))


def _up(w, m: unet.Up, x, skip):
    x = w(m.up, x)
    return w(m.conv, np.concatenate([skip, x], axis=m.layout.channel_axis))


def _unet(w, m: unet.UNet, x):
    e1 = w(m.enc1, x)
    e2 = w(m.enc2, w(m.pool, e1))
    b = w(m.bottleneck, w(m.pool, e2))
    return w(m.head, w(m.up1, w(m.up2, b, e2), e1))


_HANDLERS: dict[type, Callable] = {
    nn.Conv: _conv,
    nn.ConvTranspose: _conv_transpose,
    nn.BatchNorm: _batch_norm,
    nn.GroupNorm: _group_norm,
    nn.MaxPool: _max_pool,
    nn.AvgPool: _avg_pool,
    nn.AdaptiveAvgPool: _adaptive,
    nn.GlobalAvgPool: _global,
    nn.Upsample: _upsample,
    nn.Dense: _dense,
    nn.Flatten: _flatten,
    nn.ReLU: lambda w, m, x: ref.relu(x),
    nn.ReLU6: _relu6,
    nn.Dropout: lambda w, m, x: x,  # references run with dropout off
    Sequential: _sequential,
    resnet.BasicBlock: _basic_block,
    resnet.Bottleneck: _bottleneck,
    resnet.ResNet: _resnet,
    mobilenet.InvertedResidual: _inverted_residual,
    mobilenet.MobileNetV2: _mobilenet,
    small_cnn.SmallCNN: _pool_flatten_classify,
    vgg.VGG: _pool_flatten_classify,
    cnn3d.SmallCNN3D: _cnn3d,
    unet.Up: _up,
    unet.UNet: _unet,
}


def supported_types() -> list[str]:
    return sorted(t.__name__ for t in _HANDLERS)


def numpy_forward(
    model: nnx.Module, x: Any, *, train: bool = False
) -> tuple[np.ndarray, list[LayerOutput]]:
    """``(output, layer outputs)`` of ``model`` on ``x`` computed in float64 NumPy.

    ``train`` normalizes with batch statistics (running statistics are not updated),
    otherwise with the running ones; dropout is off. Outputs are in the model's layout.
    """
    model = in_own_layout(model)  # its layers' outputs are recorded in the model's layout
    walker = _Walker(model, train)
    out = walker(model, np.asarray(x, np.float64))
    return out, walker.recorder.records
