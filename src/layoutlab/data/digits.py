"""scikit-learn's digits: 1797 8x8 grayscale images of 10 classes, shipped with sklearn."""

from __future__ import annotations

import numpy as np

from layoutlab.data.dataset import Dataset, make_dataset, split_by_seed

__all__ = ["load_digits"]

# load_digits pixels are counts of set bits in 4x4 blocks: integers 0..16.
_DIGITS_MAX = 16.0


def load_digits(*, seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """The digits data set, split into train/test by ``seed``."""
    from sklearn.datasets import load_digits as _sk_load_digits

    bunch = _sk_load_digits()
    images = np.asarray(bunch.images, np.float32)[..., None]  # (N, 8, 8, 1)
    labels = np.asarray(bunch.target, np.int32)
    train, test = split_by_seed(images, labels, test_fraction=test_fraction, seed=seed)
    return make_dataset(
        "digits",
        train,
        test,
        num_classes=10,
        scale=_DIGITS_MAX,
        class_names=tuple(str(d) for d in range(10)),
    )
