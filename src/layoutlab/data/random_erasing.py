"""Random erasing (timm's ``RandomErasing``, ``--reprob``) on device, in either layout.

Each image of a normalized batch, with probability ``probability``, gets one rectangle
replaced: by normal noise, one value per pixel and channel (``"pixel"``, timm's default
``--remode``), or by zeros, the data set's mean (``"const"``). The rectangle covers a
fraction of the image drawn uniformly from [0.02, 1/3], with its log aspect ratio uniform
in [log 0.3, log 1/0.3] (timm's defaults); a side that would not fit is cut to the image
(timm draws again, up to 10 times), and its place is uniform over those where it fits.
Every draw, the noise included, is made in NHWC order from the key and the batch's shape,
so NHWC and NCHW batches with one key are the same images up to the transpose.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from layoutlab.data.augment_policy import ERASING_MODES
from layoutlab.layout import Layout, parse_layout

__all__ = ["random_erasing"]

_AREA = (0.02, 1.0 / 3.0)
_LOG_ASPECT = (math.log(0.3), math.log(1.0 / 0.3))


def random_erasing(
    key: jax.Array,
    images: jax.Array,
    layout: Layout | str,
    probability: float,
    mode: str = "pixel",
) -> jax.Array:
    """``images`` (rank 4, ``layout`` NHWC or NCHW) with one rectangle erased in each image
    picked with ``probability`` (see the module). Pure and jit-able; ``probability`` and
    ``mode`` are static."""
    if mode not in ERASING_MODES:
        raise ValueError(f"Unknown erasing mode {mode!r}; use one of: {', '.join(ERASING_MODES)}.")
    if images.ndim != 4:
        raise ValueError(f"random_erasing takes a batch of 2D images (rank 4), got {images.shape}.")
    layout = parse_layout(layout, rank=4)
    n = images.shape[0]
    h, w = layout.spatial_shape(images.shape)
    c = layout.channels(images.shape)
    k_pick, k_area, k_aspect, k_top, k_left, k_noise = jax.random.split(key, 6)
    picked = jax.random.bernoulli(k_pick, probability, (n,))
    area = jax.random.uniform(k_area, (n,), minval=_AREA[0], maxval=_AREA[1]) * (h * w)
    aspect = jnp.exp(jax.random.uniform(k_aspect, (n,), minval=_LOG_ASPECT[0],
                                        maxval=_LOG_ASPECT[1]))  # fmt: skip
    eh = jnp.clip(jnp.round(jnp.sqrt(area * aspect)), 1, h).astype(jnp.int32)
    ew = jnp.clip(jnp.round(jnp.sqrt(area / aspect)), 1, w).astype(jnp.int32)
    places_y = (h - eh + 1).astype(jnp.float32)
    places_x = (w - ew + 1).astype(jnp.float32)
    top = jnp.floor(jax.random.uniform(k_top, (n,)) * places_y).astype(jnp.int32)
    left = jnp.floor(jax.random.uniform(k_left, (n,)) * places_x).astype(jnp.int32)
    rows, cols = jnp.arange(h)[None, :], jnp.arange(w)[None, :]
    in_rows = (rows >= top[:, None]) & (rows < (top + eh)[:, None])  # (n, h)
    in_cols = (cols >= left[:, None]) & (cols < (left + ew)[:, None])  # (n, w)
    mask = picked[:, None, None] & in_rows[:, :, None] & in_cols[:, None, :]  # (n, h, w)
    if mode == "pixel":
        fill = jax.random.normal(k_noise, (n, h, w, c), jnp.float32).astype(images.dtype)
        if not layout.is_channels_last:
            fill = jnp.transpose(fill, (0, 3, 1, 2))
    else:
        fill = jnp.zeros((), images.dtype)
    mask = mask[..., None] if layout.is_channels_last else mask[:, None]
    return jnp.where(mask, fill, images)
