"""Dtype choices shared by the layers: where half precision accumulates in float32."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from layoutlab.precision import Policy

__all__ = ["accumulation_dtype", "channel_shape"]


def accumulation_dtype(policy: Policy) -> np.dtype | None:
    """``preferred_element_type`` for convs and dots: float32 whenever compute is half.

    XLA lowers a half-precision conv or dot with an f32 result to the backend's f32
    accumulation (cuDNN/cuBLAS on GPU, f32 dots on CPU), which is what autocast gets.
    """
    return np.dtype(jnp.float32) if policy.is_half else None


def channel_shape(rank: int, channel_axis: int, channels: int) -> tuple[int, ...]:
    """Shape that broadcasts a per-channel vector against an activation of ``rank``."""
    shape = [1] * rank
    shape[channel_axis] = channels
    return tuple(shape)
