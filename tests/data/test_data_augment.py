"""On-device crop+flip: layout equivalence, semantics against NumPy, jit, strict dtypes."""

import jax
import jax.numpy as jnp
import numpy as np

from layoutlab.data import augment


def _images(n=6, h=5, w=7, c=2):
    return np.random.default_rng(0).standard_normal((n, h, w, c)).astype(np.float32)


def _candidates(image, pad):
    """Every crop (and mirrored crop) of one zero-padded HWC image, built in NumPy."""
    h, w, _ = image.shape
    padded = np.pad(image, ((pad, pad), (pad, pad), (0, 0)))
    for dy in range(2 * pad + 1):
        for dx in range(2 * pad + 1):
            crop = padded[dy : dy + h, dx : dx + w]
            yield crop
            yield crop[:, ::-1]


def test_nhwc_and_nchw_agree_up_to_transpose():
    x = _images()
    key = jax.random.key(42)
    fn = jax.jit(augment, static_argnames=("layout", "pad", "flip"))
    a = np.asarray(fn(key, jnp.asarray(x), "NHWC"))
    b = np.asarray(fn(key, jnp.asarray(x.transpose(0, 3, 1, 2)), "NCHW"))
    # Pure data movement: the two layouts must match bit for bit.
    np.testing.assert_array_equal(a.transpose(0, 3, 1, 2), b)
    assert not np.array_equal(a, x)  # something happened


def test_each_output_is_a_padded_crop_maybe_flipped():
    x = _images(n=8)
    pad = 2
    out = np.asarray(
        jax.jit(augment, static_argnames=("layout", "pad"))(
            jax.random.key(1), jnp.asarray(x), "NHWC", pad=pad
        )
    )
    for image, result in zip(x, out, strict=True):
        assert any(np.array_equal(result, c) for c in _candidates(image, pad))
    assert np.array_equal(
        np.asarray(augment(jax.random.key(1), jnp.asarray(x), "NHWC", pad=0, flip=False)), x
    )


def test_low_precision_under_strict_promotion():
    x = jnp.asarray(_images(n=4)).transpose(0, 3, 1, 2)
    key = jax.random.key(3)
    reference = augment(key, x, "NCHW")
    for dtype in (jnp.bfloat16, jnp.float16):
        out = augment(key, x.astype(dtype), "NCHW")
        assert out.dtype == dtype and out.shape == x.shape
        # Crop, zero padding and flip only move values, so they commute with the cast: exact.
        np.testing.assert_array_equal(np.asarray(out), np.asarray(reference.astype(dtype)))
