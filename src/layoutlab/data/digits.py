"""scikit-learn's digits: 1797 8x8 grayscale images of 10 classes, shipped with sklearn."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import importlib.util
from pathlib import Path

import numpy as np

from layoutlab.data.dataset import Dataset, make_dataset, split_by_seed
from layoutlab.data.fingerprint import files_fingerprint

__all__ = ["digits_table", "load_digits"]

# load_digits pixels are counts of set bits in 4x4 blocks: integers 0..16.
_DIGITS_MAX = 16.0


def _digits_file() -> Path:
    """Where sklearn keeps the digits CSV, found without importing sklearn."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    root = (spec and spec.submodule_search_locations or [""])[0]
    return Path(root, "datasets", "data", "digits.csv.gz")


def digits_table() -> tuple[np.ndarray, dict]:
    """``(1797, 65)``: each row 64 pixels, then the label, as ``sklearn.datasets.load_digits``
    reads them, and the fingerprint of what they were read from. Read straight from the CSV
    sklearn ships, without importing sklearn: importing it (scipy with it) costs more CPU
    time than the rest of a short training run's start."""
    file = _digits_file()
    if not file.is_file():  # another layout of sklearn: ask it
        from sklearn.datasets import load_digits as _sk_load_digits

        data, target = _sk_load_digits(return_X_y=True)
        table = np.concatenate([data, target[:, None]], axis=1)
        digest = hashlib.sha256(np.ascontiguousarray(table, np.float64).tobytes())
        return table, {"files": 0, "bytes": table.nbytes, "sha256": digest.hexdigest()}
    with gzip.open(file, "rt") as f:
        table = np.loadtxt(f, delimiter=",")
    return table, files_fingerprint(file.parent, [file])


def load_digits(*, seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """The digits data set, split into train/test by ``seed``."""
    table, fingerprint = digits_table()
    images = np.asarray(table[:, :-1], np.float32).reshape(-1, 8, 8, 1)  # (N, 8, 8, 1)
    labels = np.asarray(table[:, -1], np.int32)
    train, test = split_by_seed(images, labels, test_fraction=test_fraction, seed=seed)
    dataset = make_dataset(
        "digits",
        train,
        test,
        num_classes=10,
        scale=_DIGITS_MAX,
        class_names=tuple(str(d) for d in range(10)),
    )
    return dataclasses.replace(dataset, fingerprint=fingerprint)
