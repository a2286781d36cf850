"""Running a PyTorch model the way a layerwise comparison runs the JAX one: full float32
precision, train or eval mode with dropout off, every leaf module's output in call order
under its ``named_modules()`` name, and every parameter's gradient of a cross-entropy loss.

Needs the optional PyTorch extra: ``pip install 'layoutlab[torch]'``.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import numpy as np

from layoutlab.compare.layer_recording import LayerOutput, LayerRecorder
from layoutlab.compare.torch_weights import require_torch

torch = require_torch()
from torch import nn  # noqa: E402

__all__ = [
    "TORCH_PRECISION",
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
    tracked = {
        id(mod): (name, type(mod).__name__)
        for name, mod in module.named_modules()
        if name and (include_containers or not any(True for _ in mod.children()))
    }
    recorder = LayerRecorder(tracked)

    def hook(mod, _inputs, output):
        if isinstance(output, torch.Tensor):
            # A copy: an in-place ReLU after this layer would overwrite the tensor.
            recorder.add(mod, _numpy(output))

    handles = [mod.register_forward_hook(hook) for mod in module.modules() if id(mod) in tracked]
    try:
        with pinned_torch_precision(), torch.no_grad():
            out = module(_tensor(x))
    finally:
        for h in handles:
            h.remove()
    return _numpy(out), recorder.records


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
