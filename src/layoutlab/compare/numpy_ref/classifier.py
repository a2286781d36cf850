"""Float64 ops of a classifier's head and its loss: dense, flatten, ReLU and softmax
cross-entropy."""

from __future__ import annotations

from typing import Any

import numpy as np

from layoutlab.compare.numpy_ref.layouts import (
    channel_vector,
    f64,
    read_layout,
    to_channels_first,
)

__all__ = ["dense", "flatten", "relu", "softmax_cross_entropy"]


def dense(x: Any, kernel: Any, bias: Any = None) -> np.ndarray:
    """``x @ kernel + bias`` with ``kernel`` of shape ``(in, out)``."""
    x, k = f64(x), f64(kernel)
    if k.ndim != 2 or x.shape[-1] != k.shape[0]:
        raise ValueError(
            f"dense: kernel must be (in, out) with in = {x.shape[-1]}, got shape {k.shape}."
        )
    y = x @ k
    if bias is not None:
        y = y + channel_vector(bias, k.shape[1], 0.0, "dense bias")
    return y


def flatten(x: Any, layout: Any, order: str = "CHW") -> np.ndarray:
    """``(N, features)``. ``order="CHW"`` flattens channels-first, as PyTorch flattens an NCHW
    tensor, whatever ``layout`` is; ``"HWC"`` flattens channels-last (any rank)."""
    x = f64(x)
    lay = read_layout(layout, x, "flatten")
    order = order.upper()
    if order not in ("CHW", "HWC"):
        raise ValueError(f"flatten: order must be 'CHW' or 'HWC', got {order!r}.")
    xc = to_channels_first(x, lay)
    if order == "HWC":
        xc = np.moveaxis(xc, 1, -1)
    return xc.reshape((xc.shape[0], -1))


def relu(x: Any) -> np.ndarray:
    return np.maximum(f64(x), 0.0)


def softmax_cross_entropy(logits: Any, labels: Any) -> np.ndarray:
    """Per-example cross entropy (no reduction). ``labels`` are integer class indices of
    shape ``logits.shape[:-1]`` or probabilities of ``logits``'s shape."""
    z = f64(logits)
    labels = np.asarray(labels)
    shifted = z - z.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    if labels.shape == z.shape and not np.issubdtype(labels.dtype, np.integer):
        return -(labels.astype(np.float64) * log_probs).sum(axis=-1)
    if labels.shape != z.shape[:-1] or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"softmax_cross_entropy: labels must be integer indices of shape {z.shape[:-1]} or "
            f"probabilities of shape {z.shape}, got {labels.dtype} {labels.shape}."
        )
    if labels.size and (labels.min() < 0 or labels.max() >= z.shape[-1]):
        raise ValueError(
            f"softmax_cross_entropy: labels must be in [0, {z.shape[-1]}), got "
            f"[{labels.min()}, {labels.max()}]."
        )
    return -np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
