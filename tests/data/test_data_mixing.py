"""Mixup and CutMix (``data.mixing``) against NumPy: the images, ``lam`` as the box's area,
targets that sum to 1, the dominant label, and both layouts."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from layoutlab.data.mixing import mix_batch
from layoutlab.train.program import INIT_COMPILER_OPTIONS

N, H, W, C, CLASSES = 6, 7, 9, 2, 5


def _batch():
    rng = np.random.default_rng(0)
    # Distinct values everywhere, so where a pixel came from can be read off it.
    images = rng.permutation(N * H * W * C).reshape(N, H, W, C).astype(np.float32)
    labels = rng.integers(0, CLASSES, N).astype(np.int32)
    return images, labels


@functools.cache
def _program():
    """Every mix of one key in one program (a third of the compile time of one each),
    compiled without LLVM optimizations (the mixing is decided in the HLO)."""
    x, y = _batch()

    def run(key):
        a, b = jnp.asarray(x), jnp.asarray(y)
        return {
            "mixup": mix_batch(key, a, b, "NHWC", CLASSES, mixup_alpha=0.4),
            "cutmix": mix_batch(key, a, b, "NHWC", CLASSES, cutmix_alpha=1.0),
            "cutmix NCHW": mix_batch(key, a.transpose(0, 3, 1, 2), b, "NCHW", CLASSES,
                                     cutmix_alpha=1.0),
            "both": mix_batch(key, a, b, "NHWC", CLASSES, mixup_alpha=0.4, cutmix_alpha=1.0),
        }  # fmt: skip

    return jax.jit(run).lower(jax.random.key(0)).compile(INIT_COMPILER_OPTIONS)


def _mix(seed, kind):
    return tuple(np.asarray(a) for a in _program()(jax.random.key(seed))[kind])


def _targets(labels, lam):
    """The NumPy reference: float64 one-hots of y and of the reversed batch's y, mixed."""
    eye = np.eye(CLASSES)
    return lam * eye[labels] + (1 - lam) * eye[labels[::-1]]


def test_mixup_blends_with_the_reversed_batch():
    x, y = _batch()
    mixed, targets, dominant, lam = _mix(3, "mixup")
    assert 0 < lam < 1
    want = lam * x.astype(np.float64) + (1 - lam) * x[::-1].astype(np.float64)
    # float32 arithmetic on values below N*H*W*C = 756: a few ulps of 756, 1e-4.
    np.testing.assert_allclose(mixed, want, rtol=0, atol=1e-4)
    # The targets are float32 products of lam: 1e-6 of the float64 reference.
    np.testing.assert_allclose(targets, _targets(y, lam), rtol=0, atol=1e-6)
    np.testing.assert_allclose(targets.sum(axis=1), 1.0, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(dominant, y if lam >= 0.5 else y[::-1])


def _box_of(mixed, x):
    """The pixels of each image taken from the reversed batch (NumPy), as one (H, W) mask."""
    taken = (mixed == x[::-1]).all(axis=-1) & (mixed != x).any(axis=-1)
    assert (taken == taken[0]).all()  # one box for the whole batch
    return taken[0]


def test_cutmix_lam_is_the_share_outside_the_box_in_both_layouts():
    x, y = _batch()
    seen = 0
    for seed in range(4):
        mixed, targets, dominant, lam = _mix(seed, "cutmix")
        box = _box_of(mixed, x)
        rows, cols = np.nonzero(box)
        if box.any():  # a rectangle
            seen += 1
            assert box.sum() == (np.ptp(rows) + 1) * (np.ptp(cols) + 1)
        np.testing.assert_array_equal(np.where(box[None, :, :, None], x[::-1], x), mixed)
        # lam is 1 - area / (H W) in float32: two roundings, 1e-6.
        np.testing.assert_allclose(lam, 1 - box.sum() / (H * W), rtol=0, atol=1e-6)
        np.testing.assert_allclose(targets, _targets(y, lam), rtol=0, atol=1e-6)
        np.testing.assert_allclose(targets.sum(axis=1), 1.0, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(dominant, y if lam >= 0.5 else y[::-1])
        nchw = _mix(seed, "cutmix NCHW")
        np.testing.assert_array_equal(nchw[0], mixed.transpose(0, 3, 1, 2))  # moves only
        assert nchw[3] == lam
    assert seen >= 2


def test_both_alphas_pick_one_mix_per_batch():
    x, y = _batch()
    kinds = set()
    for seed in range(8):
        mixed, targets, _, lam = _mix(seed, "both")
        from_either = np.isin(mixed, x).all()  # cutmix moves values; mixup blends them
        kinds.add("cutmix" if from_either else "mixup")
        np.testing.assert_allclose(targets.sum(axis=1), 1.0, rtol=0, atol=1e-6)
    assert kinds == {"cutmix", "mixup"}
