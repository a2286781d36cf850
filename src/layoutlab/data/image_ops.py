"""The image ops of TrivialAugment and RandAugment, on one float32 image in pixel units
``[0, 1]``, channels first (``chw=True``: ``(C, H, W)``) or last (``(H, W, C)``).

The geometric ops are one affine warp (``warp``: dm-pix's bilinear interpolation of each
channel plane); solarize is dm-pix's, and the gray image its Rec. 601 luma. The
enhance ops follow PIL's ``ImageEnhance`` (what timm and torchvision's TrivialAugment apply):
a blend of the image with a degenerate one (black, gray, the mean gray, a smoothed image),
clipped to ``[0, 1]``; dm-pix's brightness and contrast are TensorFlow's (an added delta, a
per-channel mean), so they are not these ops. Posterize and equalize quantize to 8 bits as
PIL does; the other ops keep the float values. Every op is traceable with traced magnitudes,
for ``jax.vmap`` over a batch.
"""

from __future__ import annotations

import contextlib

import dm_pix
import jax
import jax.numpy as jnp

__all__ = [
    "autocontrast",
    "brightness",
    "color",
    "contrast",
    "equalize",
    "gray",
    "invert",
    "posterize",
    "sharpness",
    "solarize",
    "solarize_add",
    "warp",
]

_LEVELS = 255  # 8-bit pixel values, as PIL's ops see them


@contextlib.contextmanager
def _as_dm_pix_expects():
    # dm-pix mixes int and float arrays and broadcasts across ranks (NumPy's rules): its
    # calls run under JAX's standard promotion, whatever the caller's settings.
    with jax.numpy_dtype_promotion("standard"), jax.numpy_rank_promotion("allow"):
        yield


def _axes(chw: bool) -> tuple[int, tuple[int, int]]:
    return (0, (1, 2)) if chw else (2, (0, 1))


def _blend(degenerate, image, factor):
    """PIL's ``Image.blend(degenerate, image, factor)`` of an enhance op, clipped."""
    return jnp.clip(degenerate + factor * (image - degenerate), 0.0, 1.0)


def gray(image, chw: bool):
    """The gray image (one channel, kept): RGB's Rec. 601 luma (dm-pix), the image itself
    when it has one channel, and the channel mean otherwise."""
    channel, _ = _axes(chw)
    channels = image.shape[channel]
    if channels == 3:
        with _as_dm_pix_expects():
            return dm_pix.rgb_to_grayscale(image, channel_axis=channel)
    if channels == 1:
        return image
    return jnp.mean(image, axis=channel, keepdims=True)


def brightness(image, factor, chw: bool):
    return _blend(jnp.zeros_like(image), image, factor)


def color(image, factor, chw: bool):
    """Saturation: a blend with the gray image (a one-channel image has no color: unchanged,
    as PIL's ``Color`` of an ``L`` image)."""
    return _blend(gray(image, chw), image, factor)


def contrast(image, factor, chw: bool):
    """A blend with the mean of the gray image."""
    return _blend(jnp.mean(gray(image, chw)), image, factor)


def sharpness(image, factor, chw: bool):
    """A blend with PIL's SMOOTH filter (3x3, centre 5, the rest 1, over 13) of the image;
    the border pixels stay as they are, as in PIL."""
    _, (ay, ax) = _axes(chw)
    h, w = image.shape[ay], image.shape[ax]
    if h < 3 or w < 3:
        return image
    total = 4.0 * _slice(image, ay, ax, 1, 1, h, w)
    for dy in range(3):
        for dx in range(3):
            total = total + _slice(image, ay, ax, dy, dx, h, w)
    smooth = total / 13.0
    widths = [(0, 0)] * 3
    widths[ay], widths[ax] = (1, 1), (1, 1)
    inner = jnp.zeros((h - 2, w - 2), bool)
    border = jnp.pad(inner, 1, constant_values=True)
    border = border[None] if chw else border[..., None]
    degenerate = jnp.where(border, image, jnp.pad(smooth, widths))
    return _blend(degenerate, image, factor)


def _slice(image, ay, ax, dy, dx, h, w):
    index = [slice(None)] * 3
    index[ay], index[ax] = slice(dy, dy + h - 2), slice(dx, dx + w - 2)
    return image[tuple(index)]


def invert(image):
    return 1.0 - image


def solarize(image, threshold):
    """Every value at or above ``threshold`` inverted (dm-pix)."""
    with _as_dm_pix_expects():
        return dm_pix.solarize(image, threshold)


def solarize_add(image, addition, threshold=128 / _LEVELS):
    """timm's SolarizeAdd: ``addition`` added to the values below ``threshold``, clipped."""
    return jnp.where(image < threshold, jnp.minimum(image + addition, 1.0), image)


def _quantized(image):
    return jnp.round(jnp.clip(image, 0.0, 1.0) * _LEVELS)


def posterize(image, bits):
    """The ``bits`` highest bits of each 8-bit value kept (PIL's ``posterize``)."""
    step = jnp.exp2(8.0 - bits)
    return jnp.floor(_quantized(image) / step) * step / _LEVELS


def autocontrast(image, chw: bool):
    """Each channel stretched to ``[0, 1]`` from its lowest and highest value (a constant
    channel unchanged), PIL's ``autocontrast`` without its 8-bit rounding."""
    _, spatial = _axes(chw)
    lo = jnp.min(image, axis=spatial, keepdims=True)
    hi = jnp.max(image, axis=spatial, keepdims=True)
    span = jnp.where(hi > lo, hi - lo, 1.0)
    return jnp.where(hi > lo, (image - lo) / span, image)


def equalize(image, chw: bool):
    """PIL's ``equalize`` of each channel's 8-bit histogram (a channel with one value, or
    whose values but the highest are too few for a step, unchanged)."""
    channel, _ = _axes(chw)
    planes = jnp.moveaxis(image, channel, 0)
    return jnp.moveaxis(jax.vmap(_equalize_plane)(planes), 0, channel)


def _equalize_plane(plane):
    q = _quantized(plane).astype(jnp.int32)
    hist = jnp.bincount(q.ravel(), length=_LEVELS + 1)
    step = (q.size - hist[jnp.max(q)]) // _LEVELS
    before = jnp.cumsum(hist) - hist
    lut = jnp.minimum((step // 2 + before) // jnp.maximum(step, 1), _LEVELS)
    return jnp.where(step > 0, lut[q].astype(plane.dtype) / _LEVELS, plane)


def warp(image, matrix, offset, chw: bool):
    """The image sampled (bilinear, dm-pix) at ``matrix @ (y, x) + offset`` for each output
    pixel ``(y, x)``; a point outside the image is 0. The identity leaves every value as it
    is. Each channel plane is interpolated in 2D on coordinates computed once: dm-pix's
    ``affine_transform`` of the whole image would interpolate along the channel axis too,
    with 8 corners instead of 4 and coordinates for every value."""
    channel, (ay, ax) = _axes(chw)
    h, w = image.shape[ay], image.shape[ax]
    yy, xx = jnp.meshgrid(
        jnp.arange(h, dtype=jnp.float32), jnp.arange(w, dtype=jnp.float32), indexing="ij"
    )
    ys = matrix[0, 0] * yy + matrix[0, 1] * xx + offset[0]
    xs = matrix[1, 0] * yy + matrix[1, 1] * xx + offset[1]
    coordinates = jnp.stack([ys, xs])

    def plane(values):
        with _as_dm_pix_expects():
            return dm_pix.flat_nd_linear_interpolate_constant(values, coordinates, cval=0.0)

    return jax.vmap(plane, in_axes=channel, out_axes=channel)(image)
