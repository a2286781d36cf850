"""On-device augmentation in any layout: random crop after zero padding, horizontal flip.

The random draws depend on the batch size and the key only, never on the layout, so NHWC and
NCHW batches augmented with one key are the same images up to the transpose.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from layoutlab.layout import Layout, parse_layout

__all__ = ["augment", "random_crop", "random_flip"]


def random_crop(key: jax.Array, images: jax.Array, layout: Layout | str, *, pad: int = 4):
    """Zero-pad every spatial axis by ``pad`` and crop back to the input size at a random place."""
    layout = parse_layout(layout, rank=images.ndim)
    if pad < 0:
        raise ValueError(f"pad must be >= 0, got {pad}.")
    if pad == 0:
        return images
    n, axes = images.shape[0], layout.spatial_axes
    widths = [(pad, pad) if a in axes else (0, 0) for a in range(images.ndim)]
    padded = jnp.pad(images, widths)
    offsets = jax.random.randint(key, (n, len(axes)), 0, 2 * pad + 1, dtype=jnp.int32)
    example_shape = images.shape[1:]

    def crop_one(example, offset):
        start = [0] * len(example_shape)
        for i, axis in enumerate(axes):
            start[axis - 1] = offset[i]  # axis - 1: one example has no batch axis
        return jax.lax.dynamic_slice(example, start, example_shape)

    return jax.vmap(crop_one)(padded, offsets)


def random_flip(key: jax.Array, images: jax.Array, layout: Layout | str):
    """Mirror each example along its last spatial axis (width) with probability 1/2."""
    layout = parse_layout(layout, rank=images.ndim)
    n = images.shape[0]
    flip = jax.random.bernoulli(key, 0.5, (n,)).reshape((n,) + (1,) * (images.ndim - 1))
    return jnp.where(flip, jnp.flip(images, axis=layout.spatial_axes[-1]), images)


def augment(
    key: jax.Array, images: jax.Array, layout: Layout | str, *, pad: int = 4, flip: bool = True
) -> jax.Array:
    """CIFAR-style augmentation of a batch; pure and jit-able (``pad``/``flip`` are static)."""
    crop_key, flip_key = jax.random.split(key)
    images = random_crop(crop_key, images, layout, pad=pad)
    return random_flip(flip_key, images, layout) if flip else images
