"""A PyTorch model's ReLU/ReLU6/max-pool decisions and parameter gradients in float64, the
reference a gradient comparison counts decision flips against (``compare.decisions``).

Float64 rather than float32: a float32 reference takes near-zero decisions as arbitrarily
as the candidate does, so only float64 can say which side of zero a value really is on.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from layoutlab.compare.decisions import Decision
from layoutlab.compare.torch_weights import require_torch

torch = require_torch()
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

__all__ = ["torch_decisions", "torch_float64_grads"]

_POOLS = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d)
_POOL_FNS = {nn.MaxPool1d: F.max_pool1d, nn.MaxPool2d: F.max_pool2d, nn.MaxPool3d: F.max_pool3d}


def _tuple(v, n):
    return tuple(v) if isinstance(v, tuple | list) else (v,) * n


def _pool_choice(module, x) -> np.ndarray:
    """Window offset (row-major) of each output's maximum: torch's indices (flat, in the
    unpadded plane, first maximum) turned into positions inside each window."""
    n = x.dim() - 2
    k, s, p = (_tuple(v, n) for v in (module.kernel_size, module.stride, module.padding))
    y, idx = _POOL_FNS[type(module)](x, k, s, p, return_indices=True)
    idx = idx.numpy()
    spatial = x.shape[2:]
    coords = np.unravel_index(idx, spatial)
    offset = np.zeros(idx.shape, np.int64)
    for d in range(n):
        out_pos = np.arange(y.shape[2 + d]).reshape([-1 if e == d else 1 for e in range(n)])
        within = coords[d] - (out_pos * s[d] - p[d])
        offset = offset * k[d] + within
    return offset.astype(np.int32)


def torch_decisions(module: nn.Module, x: Any, train: bool) -> tuple[list[Decision], Any, Any]:
    """``(decisions, module in float64, output)`` of one float64 forward of a copy of
    ``module`` (train or eval mode, dropout off); names are ``named_modules()`` names,
    repeated calls numbered ``#2``..."""
    from layoutlab.compare.torch_layerwise import set_torch_mode

    model = set_torch_mode(copy.deepcopy(module), train).double()
    names = {id(m): name for name, m in model.named_modules()}
    decisions: list[Decision] = []
    calls: dict[str, int] = {}

    def hook(m, args):
        (v,) = args
        name = names[id(m)]
        calls[name] = calls.get(name, 0) + 1
        site = name if calls[name] == 1 else f"{name}#{calls[name]}"
        v = v.detach()
        if isinstance(m, _POOLS):
            value, kind = _pool_choice(m, v), "max_pool"
        elif isinstance(m, nn.ReLU6):
            value, kind = ((v > 0) & (v < 6)).numpy(), "relu6"
        else:
            value, kind = (v > 0).numpy(), "relu"
        decisions.append(Decision(site, kind, value, len(decisions)))

    handles = [
        m.register_forward_pre_hook(hook)
        for m in model.modules()
        if isinstance(m, (nn.ReLU, nn.ReLU6, *_POOLS))
    ]
    try:
        xt = torch.from_numpy(np.asarray(x, np.float64))
        with torch.no_grad():
            out = model(xt)
    finally:
        for h in handles:
            h.remove()
    return decisions, model, out.numpy()


def torch_float64_grads(
    model: nn.Module, x: Any, labels: Any, *, train: bool
) -> tuple[float, dict[str, np.ndarray]]:
    """``(loss, {name: gradient})`` of the mean cross-entropy of a float64 ``model``
    (``torch_decisions``'s), gradients in float64."""
    model = set_float64_mode(model, train)
    model.zero_grad(set_to_none=True)
    logits = model(torch.from_numpy(np.asarray(x, np.float64)))
    loss = F.cross_entropy(logits, torch.from_numpy(np.asarray(labels, np.int64)))
    loss.backward()
    grads = {
        name: p.grad.numpy() if p.grad is not None else np.zeros(tuple(p.shape))
        for name, p in model.named_parameters()
    }
    return float(loss.detach()), grads


def set_float64_mode(model: nn.Module, train: bool) -> nn.Module:
    from layoutlab.compare.torch_layerwise import set_torch_mode

    return set_torch_mode(model, train)
