"""TrivialAugment-Wide and RandAugment on device, per image, in either layout.

``auto_augment(key, images, layout, policy, mean, std)`` takes a batch of normalized images
(``(x / scale - mean) / std``, as ``data.Dataset`` holds them), takes each image back to
pixel units ``[0, 1]`` in float32, applies its ops (``data.image_ops``) and normalizes it
again, in the batch's dtype.

- ``trivial`` (torchvision's ``TrivialAugmentWide``): one op per image out of 14 (identity,
  shear x/y, translate x/y, rotate, brightness, color, contrast, sharpness, posterize,
  solarize, autocontrast, equalize), its magnitude one of 31 steps of the op's wide range.
- ``rand-mM-nN`` (timm's ``rand_augment_transform``): ``N`` ops in a row per image out of
  timm's 15 (autocontrast, equalize, invert, rotate, posterize, solarize, solarize-add,
  color, contrast, brightness, sharpness, shear x/y, translate x/y), each applied with
  probability 1/2 at magnitude ``M / 10`` of its range.

The signed ops (geometry, the enhance factors) take either sign with probability 1/2. A
translation is a fraction of the image's size (timm's relative one; TrivialAugment-Wide's
32 pixels are the whole width of a 32-pixel image, 1.0 here), and what a warp brings in from
outside the image is the data set's mean (zero once normalized), as timm fills with its
mean. Every draw comes from the key and the batch size alone, never the layout, so NHWC and
NCHW batches with one key are the same images up to the transpose.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from layoutlab.data import image_ops as ops
from layoutlab.data.augment_policy import MAX_MAGNITUDE, AutoAugmentPolicy, parse_auto_augment
from layoutlab.layout import Layout, parse_layout

__all__ = ["RAND_OPS", "TRIVIAL_OPS", "auto_augment"]

TRIVIAL_OPS = (
    "identity", "shear_x", "shear_y", "translate_x", "translate_y", "rotate", "brightness",
    "color", "contrast", "sharpness", "posterize", "solarize", "autocontrast", "equalize",
)  # fmt: skip
RAND_OPS = (
    "autocontrast", "equalize", "invert", "rotate", "posterize", "solarize", "solarize_add",
    "color", "contrast", "brightness", "sharpness", "shear_x", "shear_y", "translate_x",
    "translate_y",
)  # fmt: skip
_TRIVIAL_BINS = 31  # torchvision's num_bins: magnitudes 0, 1/30, ..., 1 of each range
# Each op's largest magnitude: shear factor, translation (of the size), degrees, enhance
# factor's distance from 1. TrivialAugment-Wide's, then timm's RandAugment's.
_RANGES = {
    "trivial": {"shear": 0.99, "translate": 1.0, "rotate": 135.0, "enhance": 0.99},
    "rand": {"shear": 0.3, "translate": 0.45, "rotate": 30.0, "enhance": 0.9},
}
_PHOTOMETRIC = (
    "identity", "autocontrast", "equalize", "invert", "posterize", "solarize", "solarize_add",
    "color", "contrast", "brightness", "sharpness",
)  # fmt: skip


def _photometric(kind: str, chw: bool):
    """The branches of ``lax.switch``: ``(image, level, sign) -> image`` in ``_PHOTOMETRIC``'s
    order."""
    enhance = _RANGES[kind]["enhance"]
    trivial = kind == "trivial"

    def factor(level, sign):
        return 1.0 + sign * level * enhance

    def posterize(image, level, sign):
        # TrivialAugment-Wide: 8 bits down to 2 over its 31 steps; timm: 0 to 4 bits kept.
        bits = 8.0 - jnp.round(level * 6.0) if trivial else jnp.floor(level * 4.0)
        return ops.posterize(image, bits)

    def solarize(image, level, sign):
        # TrivialAugment-Wide: threshold 1 down to 0; timm: int(level * 256) of 255.
        threshold = 1.0 - level if trivial else jnp.floor(level * 256.0) / 255.0
        return ops.solarize(image, threshold)

    branches = {
        "identity": lambda image, level, sign: image,
        "autocontrast": lambda image, level, sign: ops.autocontrast(image, chw),
        "equalize": lambda image, level, sign: ops.equalize(image, chw),
        "invert": lambda image, level, sign: ops.invert(image),
        "posterize": posterize,
        "solarize": solarize,
        "solarize_add": lambda image, level, sign: ops.solarize_add(
            image, jnp.floor(level * 110.0) / 255.0
        ),
        "color": lambda image, level, sign: ops.color(image, factor(level, sign), chw),
        "contrast": lambda image, level, sign: ops.contrast(image, factor(level, sign), chw),
        "brightness": lambda image, level, sign: ops.brightness(image, factor(level, sign), chw),
        "sharpness": lambda image, level, sign: ops.sharpness(image, factor(level, sign), chw),
    }
    return [branches[name] for name in _PHOTOMETRIC]


def _affine(names, op, level, sign, kind, size):
    """The warp's ``(matrix, offset)`` for op index ``op`` of ``names`` (the identity for an
    op that is not geometric): output ``(y, x)`` samples input ``matrix @ (y, x) + offset``."""
    r = _RANGES[kind]
    h, w = size

    def amount(name, scale):
        return jnp.where(op == names.index(name), sign * level * scale, 0.0)

    angle = amount("rotate", r["rotate"] * math.pi / 180.0)
    shear_x, shear_y = amount("shear_x", r["shear"]), amount("shear_y", r["shear"])
    move = jnp.stack([amount("translate_y", r["translate"] * h),
                      amount("translate_x", r["translate"] * w)])  # fmt: skip
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    rotation = jnp.stack([jnp.stack([cos, -sin]), jnp.stack([sin, cos])])
    # Shears about the origin, as PIL's (and so timm's and torchvision's) are; only one of the
    # three factors is not the identity.
    shear = jnp.stack([jnp.stack([1.0, shear_y]), jnp.stack([shear_x, 1.0])])
    matrix = rotation @ shear
    center = jnp.array([(h - 1) / 2.0, (w - 1) / 2.0], jnp.float32)
    # Rotation about the centre; for the identity, center - center: exactly 0.
    return matrix, center - rotation @ center + move


def _one_image(key, image, mean, policy: AutoAugmentPolicy, chw: bool):
    kind = policy.kind
    names = TRIVIAL_OPS if kind == "trivial" else RAND_OPS
    geometric = jnp.array([n in ("shear_x", "shear_y", "translate_x", "translate_y", "rotate")
                           for n in names])  # fmt: skip
    branch = jnp.array([_PHOTOMETRIC.index(n) if n in _PHOTOMETRIC else 0 for n in names])
    branches = _photometric(kind, chw)
    size = image.shape[1:] if chw else image.shape[:2]
    for layer in range(policy.num_ops):
        k_op, k_level, k_sign, k_apply = jax.random.split(jax.random.fold_in(key, layer), 4)
        op = jax.random.randint(k_op, (), 0, len(names))
        sign = jnp.where(jax.random.bernoulli(k_sign), -1.0, 1.0)
        if kind == "trivial":
            step = jax.random.randint(k_level, (), 0, _TRIVIAL_BINS).astype(jnp.float32)
            level = step / (_TRIVIAL_BINS - 1.0)
            applied = jnp.bool_(True)
        else:
            level = jnp.float32(policy.magnitude / MAX_MAGNITUDE)
            applied = jax.random.bernoulli(k_apply)  # timm's prob=0.5 per op
        matrix, offset = _affine(names, op, level, sign, kind, size)
        warped = ops.warp(image - mean, matrix, offset, chw) + mean
        image = jnp.where(applied & geometric[op], warped, image)
        index = jnp.where(applied, branch[op], 0)
        image = jax.lax.switch(index, branches, image, level.astype(jnp.float32), sign)
    return image


def auto_augment(
    key: jax.Array,
    images: jax.Array,
    layout: Layout | str,
    policy: AutoAugmentPolicy | str,
    mean,
    std,
) -> jax.Array:
    """``images`` (normalized, rank 4, ``layout`` NHWC or NCHW) with ``policy`` (a parsed
    one or its text) applied per image; ``mean``/``std``: the per-channel statistics the
    images were normalized with, in pixel units ``[0, 1]`` (``Dataset.mean``/``std``; a
    zero std counts as 1, as the data set divides by it). Pure and jit-able."""
    if isinstance(policy, str):
        policy = parse_auto_augment(policy)
    if images.ndim != 4:
        raise ValueError(f"auto_augment takes a batch of 2D images (rank 4), got {images.shape}.")
    layout = parse_layout(layout, rank=4)
    chw = not layout.is_channels_last
    channels = images.shape[layout.channel_axis]
    mean = jnp.asarray(mean, jnp.float32).reshape(-1)
    std = jnp.asarray(std, jnp.float32).reshape(-1)
    if mean.shape != (channels,) or std.shape != (channels,):
        raise ValueError(
            f"mean and std need one value per channel ({channels}), got {mean.shape[0]} and "
            f"{std.shape[0]}."
        )
    std = jnp.where(std > 0, std, 1.0)
    shape = (1, channels, 1, 1) if chw else (1, 1, 1, channels)
    mean, std = mean.reshape(shape), std.reshape(shape)
    pixels = images.astype(jnp.float32) * std + mean
    keys = jax.random.split(key, images.shape[0])
    out = jax.vmap(lambda k, x: _one_image(k, x, mean[0], policy, chw))(keys, pixels)
    return ((out - mean) / std).astype(images.dtype)
