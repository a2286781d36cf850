"""Mixup and CutMix of a batch with its own reverse (timm's ``Mixup``, ``mode="batch"``).

``mix_batch`` draws one ``lam ~ Beta(alpha, alpha)`` per batch and mixes image ``i`` with
image ``n - 1 - i``: mixup blends them (``lam * x + (1 - lam) * x_reversed``); cutmix pastes
a box of the reversed batch, of side ``sqrt(1 - lam)`` of the image's, centred at a uniform
pixel and cut at the border, and then sets ``lam`` to the share of the image left uncovered.
With both alphas positive, each batch is one or the other with probability 1/2 (timm's
``switch_prob``). The targets are ``lam * one_hot(y) + (1 - lam) * one_hot(y_reversed)``;
the dominant label is ``y`` where ``lam >= 1/2``, else ``y_reversed``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from layoutlab.layout import Layout, parse_layout

__all__ = ["cutmix_box", "mix_batch"]


def cutmix_box(key: jax.Array, lam: jax.Array, size: tuple[int, int]):
    """``(top, bottom, left, right)`` of timm's ``rand_bbox`` for ``lam`` on an image of
    ``size`` (H, W): sides ``int(H * sqrt(1 - lam))`` and ``int(W * sqrt(1 - lam))``, centred
    at a uniform pixel, cut at the border (so the box may be smaller)."""
    h, w = size
    ratio = jnp.sqrt(1.0 - lam)
    cut_h = jnp.floor(h * ratio).astype(jnp.int32)
    cut_w = jnp.floor(w * ratio).astype(jnp.int32)
    k_y, k_x = jax.random.split(key)
    cy = jax.random.randint(k_y, (), 0, h)
    cx = jax.random.randint(k_x, (), 0, w)
    top, bottom = jnp.clip(cy - cut_h // 2, 0, h), jnp.clip(cy + cut_h // 2, 0, h)
    left, right = jnp.clip(cx - cut_w // 2, 0, w), jnp.clip(cx + cut_w // 2, 0, w)
    return top, bottom, left, right


def _mixup(images, lam):
    x = images.astype(jnp.float32)
    return (lam * x + (1.0 - lam) * x[::-1]).astype(images.dtype), lam


def _cutmix(images, lam, key, layout: Layout):
    h, w = layout.spatial_shape(images.shape)
    top, bottom, left, right = cutmix_box(key, lam, (h, w))
    rows, cols = jnp.arange(h), jnp.arange(w)
    box = ((rows >= top) & (rows < bottom))[:, None] & ((cols >= left) & (cols < right))[None]
    box = box[None, :, :, None] if layout.is_channels_last else box[None, None]
    covered = ((bottom - top) * (right - left)).astype(jnp.float32)
    return jnp.where(box, images[::-1], images), 1.0 - covered / (h * w)


def mix_batch(
    key: jax.Array,
    images: jax.Array,
    labels: jax.Array,
    layout: Layout | str,
    num_classes: int,
    *,
    mixup_alpha: float = 0.0,
    cutmix_alpha: float = 0.0,
):
    """``(images, targets, dominant labels, lam)`` of the batch mixed as the module says
    (``targets``: float32 ``(N, num_classes)``, rows summing to 1). An alpha of 0 turns its
    mix off; with both 0 the batch is unchanged and the targets are one-hot. The alphas are
    static. Pure and jit-able."""
    if labels.ndim != 1:
        raise ValueError(
            f"mixup and cutmix mix one label per image; got labels of shape {labels.shape} "
            "(a segmentation model's per-pixel labels): turn them off for such a model."
        )
    if images.ndim != 4:
        raise ValueError(f"mix_batch takes a batch of 2D images (rank 4), got {images.shape}.")
    layout = parse_layout(layout, rank=4)
    k_switch, k_mixup, k_cutmix, k_box = jax.random.split(key, 4)
    one_hot = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
    lam = jnp.float32(1.0)
    if mixup_alpha > 0 and cutmix_alpha > 0:
        use_cutmix = jax.random.bernoulli(k_switch)
        lam_mixup = jax.random.beta(k_mixup, mixup_alpha, mixup_alpha)
        lam_cutmix = jax.random.beta(k_cutmix, cutmix_alpha, cutmix_alpha)
        images, lam = jax.lax.cond(
            use_cutmix,
            lambda x: _cutmix(x, lam_cutmix, k_box, layout),
            lambda x: _mixup(x, lam_mixup),
            images,
        )
    elif mixup_alpha > 0:
        images, lam = _mixup(images, jax.random.beta(k_mixup, mixup_alpha, mixup_alpha))
    elif cutmix_alpha > 0:
        lam_cutmix = jax.random.beta(k_cutmix, cutmix_alpha, cutmix_alpha)
        images, lam = _cutmix(images, lam_cutmix, k_box, layout)
    lam = jnp.asarray(lam, jnp.float32)
    targets = lam * one_hot + (1.0 - lam) * one_hot[::-1]
    dominant = jnp.where(lam >= 0.5, labels, labels[::-1])
    return images, targets, dominant, lam
