"""How far float32 itself lands from float64 on a gradient comparison's pinned case: the
PyTorch mirror in float32 with every ReLU/ReLU6/max-pool decision pinned to the float64
reference's, against the float64 gradients. A candidate's error left after pinning is
judged by this figure: within a small multiple of it, what is left is float32's rounding,
not a defect."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from layoutlab.compare.decisions import Decision
from layoutlab.compare.torch_weights import require_torch

torch = require_torch()
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

__all__ = ["FLOAT32_FACTOR", "float32_verdict", "pinned_float32_grads", "rel_l2_errors"]

# A candidate whose per-parameter error (relative L2 against float64) stays within this many
# times PyTorch float32's own on the same pinned case is "within float32's own": two correct
# float32 implementations differ from float64 by summation order, a few times apart per
# parameter (measured below 4x on small_cnn and ResNet-18, tiny), while a defect as small as
# a 1e-3 slip in one BatchNorm backward is hundreds of times above it.
FLOAT32_FACTOR = 16.0
_EPS32 = float(np.finfo(np.float32).eps)


def _pool_pinned(m: nn.MaxPool2d, v, choice: np.ndarray):
    """The max-pool output at the pinned window offsets (row-major), differentiable."""
    k = m.kernel_size if isinstance(m.kernel_size, tuple) else (m.kernel_size,) * 2
    s = m.stride if isinstance(m.stride, tuple) else (m.stride,) * 2
    p = m.padding if isinstance(m.padding, tuple) else (m.padding,) * 2
    n, c = v.shape[:2]
    cols = F.unfold(v, k, padding=p, stride=s).view(n, c, k[0] * k[1], -1)
    index = torch.from_numpy(np.asarray(choice, np.int64)).reshape(n, c, 1, -1)
    return cols.gather(2, index).view(n, c, *choice.shape[2:])


def _pinnable(model: nn.Module) -> bool:
    """Every max pool one whose windows ``_pool_pinned`` reproduces."""
    for m in model.modules():
        if isinstance(m, nn.MaxPool1d | nn.MaxPool3d):
            return False
        if isinstance(m, nn.MaxPool2d) and (m.ceil_mode or m.dilation not in (1, (1, 1))):
            return False
    return True


def pinned_float32_grads(
    mirror: nn.Module, x: Any, labels: Any, train: bool, decisions: list[Decision]
) -> dict[str, np.ndarray] | None:
    """``{name: gradient}`` (float64 arrays) of the mean cross-entropy of ``mirror`` in
    float32 with every ReLU/ReLU6/max-pool decision taken from ``decisions`` (the float64
    run's, ``torch_decisions``); None where a pool cannot be pinned."""
    from layoutlab.compare.torch_layerwise import pinned_torch_precision, set_torch_mode

    model = set_torch_mode(copy.deepcopy(mirror).float(), train)
    if not _pinnable(model):
        return None
    names = {id(m): name for name, m in model.named_modules()}
    by_site = {d.site: d for d in decisions}
    calls: dict[str, int] = {}

    def pin(m, args, out):
        (v,) = args
        name = names[id(m)]
        calls[name] = calls.get(name, 0) + 1
        value = by_site[name if calls[name] == 1 else f"{name}#{calls[name]}"].value
        if isinstance(m, nn.MaxPool2d):
            return _pool_pinned(m, v, np.asarray(value))
        mask = torch.from_numpy(np.asarray(value, bool))
        if isinstance(m, nn.ReLU6):  # outside (0, 6): the clipped value, no gradient
            return torch.where(mask, v, out.detach())
        return v * mask.to(v.dtype)

    kinds = (nn.ReLU, nn.ReLU6, nn.MaxPool2d)
    handles = [m.register_forward_hook(pin) for m in model.modules() if isinstance(m, kinds)]
    try:
        with pinned_torch_precision():
            logits = model(torch.from_numpy(np.asarray(x, np.float32)))
            loss = F.cross_entropy(logits, torch.from_numpy(np.asarray(labels, np.int64)))
            loss.backward()
    finally:
        for h in handles:
            h.remove()
    return {
        name: (p.grad.double().numpy() if p.grad is not None else np.zeros(tuple(p.shape)))
        for name, p in model.named_parameters()
    }


def rel_l2_errors(grads: dict[str, np.ndarray], exact: dict[str, np.ndarray]) -> dict[str, float]:
    """``||g - exact|| / ||exact||`` per parameter (0 where both are 0)."""
    out = {}
    for name, want in exact.items():
        want = np.asarray(want, np.float64)
        err = float(np.linalg.norm(np.asarray(grads[name], np.float64) - want))
        scale = float(np.linalg.norm(want))
        out[name] = err / scale if scale > 0 else (0.0 if err == 0 else np.inf)
    return out


def float32_verdict(candidate: dict[str, float], own: dict[str, float]) -> dict[str, Any]:
    """The report's figures: per parameter, the candidate's error against float32's own
    (each floored at float32's epsilon, where a tiny parameter's error is 0 or chance)."""
    ratios = {n: max(candidate[n], _EPS32) / max(own[n], _EPS32) for n in own}
    worst = max(ratios, key=ratios.get)
    within = ratios[worst] <= FLOAT32_FACTOR
    return {
        "float32_own_error": max(own.values()),
        "candidate_error_pinned": max(candidate.values()),
        "worst_parameter": worst,
        "worst_ratio": ratios[worst],
        "within_float32": within,
        "text": (
            f"{'within' if within else 'BEYOND'} float32's own: the candidate's gradient "
            f"error left after pinning is at most {ratios[worst]:.3g}x PyTorch float32's on "
            f"the same pinned case (worst {worst}: relative L2 {candidate[worst]:.2e} "
            f"against {own[worst]:.2e}; float32's own up to {max(own.values()):.2e} over "
            f"all parameters; within means at most {FLOAT32_FACTOR:g}x)"
        ),
    }
