"""Batching: layouts, dtypes, determinism by seed, mid-epoch resume, too-small data sets."""

import jax.numpy as jnp
import numpy as np
import pytest

from layoutlab.data import (
    DataError,
    epoch_batches,
    make_synthetic,
    steps_per_epoch,
    train_batches,
)


@pytest.fixture(scope="module")
def ds():
    return make_synthetic((4, 3, 2), 5, 50, seed=0)  # 40 train, 10 test


def _all(batches):
    return [(x.copy(), y.copy()) for x, y in batches]


def test_layouts_and_dtypes(ds):
    nhwc = _all(epoch_batches(ds, "train", 8, layout="NHWC", seed=1))
    nchw = _all(epoch_batches(ds, "train", 8, layout="nchw", seed=1))
    assert len(nhwc) == steps_per_epoch(ds, "train", 8) == 5
    for (a, ya), (b, yb) in zip(nhwc, nchw, strict=True):
        assert a.shape == (8, 4, 3, 2) and b.shape == (8, 2, 4, 3)
        assert a.dtype == np.float32 and ya.dtype == np.int32
        assert b.flags.c_contiguous
        np.testing.assert_array_equal(np.transpose(a, (0, 3, 1, 2)), b)
        np.testing.assert_array_equal(ya, yb)
    for name, dtype in (("bfloat16", jnp.bfloat16), ("f16", jnp.float16)):
        x, _ = next(epoch_batches(ds, "train", 8, dtype=name, seed=1))
        assert x.dtype == np.dtype(dtype)
        # One rounding of float32 to a 8-bit (bf16) or 11-bit (f16) significand: 2^-8 relative.
        np.testing.assert_allclose(x.astype(np.float32), nhwc[0][0], rtol=2**-8, atol=1e-6)


def test_epoch_covers_split_and_shuffle_depends_on_seed_and_epoch(ds):
    labels = lambda **kw: np.concatenate([y for _, y in epoch_batches(ds, "train", 8, **kw)])  # noqa: E731
    order = labels(seed=0, epoch=0)
    assert sorted(order.tolist()) == sorted(ds.train_labels.tolist())
    np.testing.assert_array_equal(order, labels(seed=0, epoch=0))
    images = np.concatenate([x for x, _ in epoch_batches(ds, "train", 8, seed=0, epoch=0)])
    first = np.concatenate([x for x, _ in epoch_batches(ds, "train", 8, seed=0, epoch=1)])
    other = np.concatenate([x for x, _ in epoch_batches(ds, "train", 8, seed=9, epoch=0)])
    assert not np.array_equal(images, first) and not np.array_equal(images, other)
    unshuffled = np.concatenate(
        [y for _, y in epoch_batches(ds, "test", 4, shuffle=False, drop_last=False)]
    )
    np.testing.assert_array_equal(unshuffled, ds.test_labels)


def test_start_step_is_the_tail_of_a_full_epoch(ds):
    full = _all(epoch_batches(ds, "train", 6, seed=3, epoch=2, layout="NCHW"))
    tail = _all(epoch_batches(ds, "train", 6, seed=3, epoch=2, layout="NCHW", start_step=4))
    assert len(full) == 6 and len(tail) == 2
    for (a, ya), (b, yb) in zip(full[4:], tail, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(ya, yb)
    assert _all(epoch_batches(ds, "train", 6, start_step=6)) == []
    with pytest.raises(ValueError, match="start_step"):
        epoch_batches(ds, "train", 6, start_step=7)


def test_train_batches_resume_across_epochs(ds):
    run = _all(train_batches(ds, 16, seed=5, num_steps=7))  # 2 steps per epoch
    resumed = _all(train_batches(ds, 16, seed=5, start_step=3, num_steps=4))
    for (a, ya), (b, yb) in zip(run[3:], resumed, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(ya, yb)
    epoch1 = _all(epoch_batches(ds, "train", 16, seed=5, epoch=1))
    np.testing.assert_array_equal(run[2][0], epoch1[0][0])


def test_last_partial_batch_and_too_small(ds):
    sizes = [x.shape[0] for x, _ in epoch_batches(ds, "test", 4, drop_last=False)]
    assert sizes == [4, 4, 2]
    with pytest.raises(DataError, match="10 examples, fewer than one batch of 16"):
        epoch_batches(ds, "test", 16)
    with pytest.raises(DataError, match="fewer than one batch"):
        steps_per_epoch(ds, "test", 11)
    assert steps_per_epoch(ds, "test", 16, drop_last=False) == 1
    with pytest.raises(DataError, match="fewer than one batch"):
        train_batches(ds, 64)  # raised at the call, not at the first next()
    with pytest.raises(ValueError, match="Unknown split"):
        epoch_batches(ds, "valid", 4)
    with pytest.raises(ValueError, match="NHWC or NCHW"):
        epoch_batches(ds, "train", 4, layout="NCW")
