"""TrivialAugment and RandAugment on device (``data.auto_augment``), random erasing: the
layouts agree bit for bit, and the enhance and 8-bit ops match PIL's on 8-bit images."""

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from layoutlab.data import image_ops
from layoutlab.data.auto_augment import auto_augment
from layoutlab.data.random_erasing import random_erasing
from layoutlab.train.program import INIT_COMPILER_OPTIONS

MEAN, STD = (0.45, 0.5, 0.55), (0.2, 0.25, 0.0)  # a zero std counts as 1, as the data set's


def _normalized(n=12, h=8, w=8):
    pixels = np.random.default_rng(0).uniform(0, 1, (n, h, w, 3)).astype(np.float32)
    std = np.where(np.array(STD) > 0, STD, 1.0).astype(np.float32)
    return (pixels - np.float32(MEAN)) / std


def test_layouts_agree():
    x = _normalized()
    xt = x.transpose(0, 3, 1, 2)

    def both(key, a, b):
        out = [auto_augment(key, a, "NHWC", "rand-m9-n1", MEAN, STD),
               auto_augment(key, b, "NCHW", "rand-m9-n1", MEAN, STD)]  # fmt: skip
        erase = jax.random.fold_in(key, 1)
        out += [random_erasing(erase, a, "NHWC", 0.5), random_erasing(erase, b, "NCHW", 0.5)]
        return out

    # Level 0 (no LLVM optimizations) compiles in half the time; the ops are the HLO's.
    run = jax.jit(both).lower(jax.random.key(0), x, xt).compile(INIT_COMPILER_OPTIONS)
    rand_nhwc, rand_nchw, erase_nhwc, erase_nchw = map(np.asarray, run(jax.random.key(0), x, xt))
    # The same draws in both layouts: a different op or magnitude moves values by far more
    # than 1e-3. A reduction (the contrast's mean gray, the warp's corner sum) may add in
    # another order per layout: a few float32 ulps of values below 8, hence 1e-6.
    np.testing.assert_allclose(rand_nhwc.transpose(0, 3, 1, 2), rand_nchw, rtol=0, atol=1e-6)
    # Erasing only moves values: bit for bit.
    np.testing.assert_array_equal(erase_nhwc.transpose(0, 3, 1, 2), erase_nchw)
    changed = np.abs(rand_nhwc - x).max(axis=(1, 2, 3)) > 1e-3
    assert 0 < changed.sum() < len(x) + 1 and changed.sum() >= len(x) // 2, changed
    erased = (erase_nhwc != x).any(axis=-1)  # (n, h, w)
    assert 0 < erased.any(axis=(1, 2)).sum() < len(x), erased  # probability 1/2 per image
    for mask in erased[erased.any(axis=(1, 2))]:
        rows, cols = np.nonzero(mask)
        assert mask.sum() == (np.ptp(rows) + 1) * (np.ptp(cols) + 1)  # one rectangle
    another = np.asarray(run(jax.random.key(1), x, xt)[0])
    assert not np.array_equal(another, rand_nhwc)  # the key decides


def _pil_image(seed=1, size=9):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (size, size, 3), dtype=np.uint8)


# name: (ours on float pixels in [0, 1], PIL's on the 8-bit image, tolerance in levels)
_OPS = {
    # PIL truncates its blend to 8 bits: up to one level below ours (float).
    "brightness": (lambda x, chw: image_ops.brightness(x, 1.6, chw),
                   lambda im: ImageEnhance.Brightness(im).enhance(1.6), 1.0),
    # PIL's degenerate image (gray, the mean gray, the smoothed image) is 8-bit too, and its
    # luma weights (299, 587, 114 / 1000) are dm-pix's to 1e-4: a level of it, scaled by
    # |1 - factor| < 1, on top of the blend's: 1.5.
    "color": (lambda x, chw: image_ops.color(x, 0.3, chw),
              lambda im: ImageEnhance.Color(im).enhance(0.3), 1.5),
    "contrast": (lambda x, chw: image_ops.contrast(x, 1.7, chw),
                 lambda im: ImageEnhance.Contrast(im).enhance(1.7), 1.5),
    "sharpness": (lambda x, chw: image_ops.sharpness(x, 1.8, chw),
                  lambda im: ImageEnhance.Sharpness(im).enhance(1.8), 1.5),
    # PIL's lookup table truncates: up to one level.
    "autocontrast": (lambda x, chw: image_ops.autocontrast(x, chw), ImageOps.autocontrast, 1.0),
    # Equalize, posterize and solarize quantize as PIL does: equal values.
    "equalize": (lambda x, chw: image_ops.equalize(x, chw), ImageOps.equalize, 1e-3),
    "posterize": (lambda x, chw: image_ops.posterize(x, 3.0),
                  lambda im: ImageOps.posterize(im, 3), 1e-3),
    "solarize": (lambda x, chw: image_ops.solarize(x, 100 / 255),
                 lambda im: ImageOps.solarize(im, 100), 1e-3),
}  # fmt: skip


def test_ops_match_pil_in_both_layouts():
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (9, 9, 3), dtype=np.uint8)
    # autocontrast gets channels that do not span 0..255, so it has work to do
    inputs = {name: (pixels // 2 + 40).astype(np.uint8) if name == "autocontrast" else pixels
              for name in _OPS}  # fmt: skip

    def all_ops(images):
        out = {}
        for name, (ours, _, _) in _OPS.items():
            x = images[name].astype(jnp.float32) / 255.0
            out[name] = ours(x, False) * 255.0
            out[name + " NCHW"] = jnp.moveaxis(ours(jnp.moveaxis(x, -1, 0), True), 0, -1) * 255
        return out

    got = jax.jit(all_ops).lower(inputs).compile(INIT_COMPILER_OPTIONS)(inputs)
    for name, (_, pil, tolerance) in _OPS.items():
        want = np.asarray(pil(Image.fromarray(inputs[name])), np.float64)
        for key in (name, name + " NCHW"):
            np.testing.assert_allclose(got[key], want, rtol=0, atol=tolerance, err_msg=key)


def test_color_leaves_a_gray_image_and_one_channel_as_they_are():
    one = jnp.asarray(np.random.default_rng(2).uniform(0, 1, (5, 5, 1)), jnp.float32)
    np.testing.assert_array_equal(np.asarray(image_ops.color(one, 0.2, False)), np.asarray(one))


def test_warp_samples_the_shifted_image_and_zero_outside():
    image = np.random.default_rng(3).uniform(0, 1, (6, 7, 2)).astype(np.float32)
    eye, offset = jnp.eye(2, dtype=jnp.float32), jnp.array([1.0, -2.0], jnp.float32)
    warp = jax.jit(image_ops.warp, static_argnames="chw")
    got = np.asarray(warp(jnp.asarray(image), eye, offset, chw=False))
    got_chw = np.asarray(warp(jnp.asarray(image.transpose(2, 0, 1)), eye, offset, chw=True))
    # NumPy: output (y, x) is input (y + 1, x - 2), and 0 where that lies outside.
    want = np.zeros_like(image)
    want[:-1, 2:] = image[1:, :-2]
    np.testing.assert_array_equal(got, want)  # integer shifts: weights 0 and 1, exact
    np.testing.assert_array_equal(got_chw.transpose(1, 2, 0), want)
