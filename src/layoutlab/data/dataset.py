"""The ``Dataset`` value: normalized NHWC float32 host arrays plus what describes them.

Pixel values are first scaled to ``[0, 1]`` (uint8 / 255, digits / 16), then normalized per
channel with the mean and std of the *train* split; ``mean``/``std`` are reported in the
``[0, 1]`` units, so CIFAR-10 gives the familiar ``(0.491, 0.482, 0.447)``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from layoutlab.data.errors import DataError

__all__ = ["Dataset", "SPLITS", "channel_stats", "make_dataset", "split_by_seed"]

SPLITS = ("train", "val", "test")

# Statistics are accumulated over this many images at a time, so a float64 copy of a
# 50k-image split is never made.
_STATS_CHUNK = 4096


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
    """An image classification data set held on the host."""

    name: str
    train_images: np.ndarray  # (N, H, W, C) float32, normalized
    train_labels: np.ndarray  # (N,) int32
    test_images: np.ndarray
    test_labels: np.ndarray
    num_classes: int
    mean: tuple[float, ...]  # per channel, of pixels scaled to [0, 1], train split
    std: tuple[float, ...]
    class_names: tuple[str, ...] = ()
    # What the data was read from (data.fingerprint): {"files", "bytes", "sha256"} of its
    # files, or a generated set's {"source"}; compared when a run resumes. None: made in Python.
    fingerprint: dict | None = None
    # Bits per pixel of the image files it was read from (folder data of 16-bit images: 16),
    # so that predict scales an image file as the data set's were.
    pixel_bits: int = 8
    # The validation split held out of the train split (data.validation.with_validation);
    # None: the data set has none.
    val_images: np.ndarray | None = None
    val_labels: np.ndarray | None = None

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(H, W, C)`` of one image."""
        return tuple(self.train_images.shape[1:])

    @property
    def num_channels(self) -> int:
        return self.train_images.shape[-1]

    def split(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """``(images, labels)`` of split ``"train"``, ``"val"`` (when it has one) or ``"test"``."""
        if name == "train":
            return self.train_images, self.train_labels
        if name == "test":
            return self.test_images, self.test_labels
        if name == "val" and self.val_labels is not None:
            return self.val_images, self.val_labels
        if name == "val":
            raise ValueError("This data set has no validation split (val_fraction is 0).")
        raise ValueError(f"Unknown split {name!r}; valid splits are: {', '.join(SPLITS)}.")

    def summary(self) -> dict:
        """Plain-python description (sizes, shape, classes, stats), e.g. for JSON."""
        return {
            "name": self.name,
            "train_size": int(self.train_images.shape[0]),
            "test_size": int(self.test_images.shape[0]),
            **({} if self.val_labels is None else {"val_size": int(self.val_labels.shape[0])}),
            "image_shape": list(self.image_shape),
            "num_classes": self.num_classes,
            "class_names": list(self.class_names),
            "mean": [round(m, 6) for m in self.mean],
            "std": [round(s, 6) for s in self.std],
            "train_class_counts": _counts(self.train_labels, self.num_classes),
            "test_class_counts": _counts(self.test_labels, self.num_classes),
        }


def _counts(labels: np.ndarray, num_classes: int) -> list[int]:
    return np.bincount(labels, minlength=num_classes).tolist()


def channel_stats(images: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std (float64) of NHWC ``images / scale``."""
    channels = images.shape[-1]
    total = np.zeros(channels, np.float64)
    total_sq = np.zeros(channels, np.float64)
    for start in range(0, images.shape[0], _STATS_CHUNK):
        chunk = images[start : start + _STATS_CHUNK].astype(np.float64) / scale
        total += chunk.sum(axis=(0, 1, 2))
        total_sq += np.square(chunk).sum(axis=(0, 1, 2))
    count = images.shape[0] * images.shape[1] * images.shape[2]
    mean = total / count
    var = np.maximum(total_sq / count - np.square(mean), 0.0)
    return mean, np.sqrt(var)


def _normalize(images: np.ndarray, scale: float, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    out = images.astype(np.float32)  # always a fresh array, safe to edit in place
    out *= np.float32(1.0 / scale)
    out -= mean.astype(np.float32)
    out *= (1.0 / std).astype(np.float32)
    return out


def _check_split(name: str, split: str, images: np.ndarray, labels: np.ndarray, classes: int):
    if images.ndim != 4:
        raise DataError(f"{name} {split} images must be NHWC (rank 4), got shape {images.shape}.")
    if labels.shape != (images.shape[0],):
        raise DataError(
            f"{name} {split} has {images.shape[0]} images but labels of shape {labels.shape}."
        )
    if images.shape[0] == 0:
        raise DataError(f"{name} {split} split is empty.")
    if not np.issubdtype(labels.dtype, np.integer):
        raise DataError(
            f"{name} {split} labels have dtype {labels.dtype}, expected integer class indices."
        )
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        raise DataError(
            f"{name} {split} labels must lie in [0, {classes}), got range "
            f"[{labels.min()}, {labels.max()}]."
        )


def make_dataset(
    name: str,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    *,
    num_classes: int,
    scale: float,
    class_names: tuple[str, ...] = (),
) -> Dataset:
    """Normalize raw NHWC pixels (``0..scale``) with train-split stats and build a ``Dataset``."""
    (x_train, y_train), (x_test, y_test) = train, test
    y_train, y_test = np.asarray(y_train), np.asarray(y_test)
    # The range is checked in the labels' own dtype: cast first, 2**32 + 3 would be class 3.
    _check_split(name, "train", x_train, y_train, num_classes)
    _check_split(name, "test", x_test, y_test, num_classes)
    y_train, y_test = y_train.astype(np.int32), y_test.astype(np.int32)
    if x_train.shape[1:] != x_test.shape[1:]:
        raise DataError(
            f"{name}: train images are {x_train.shape[1:]} but test images are "
            f"{x_test.shape[1:]} (H, W, C); both splits must have one image shape."
        )
    mean, std = channel_stats(x_train, scale)
    # A constant channel has std 0; dividing by 1 keeps it finite (and zero after centering).
    safe_std = np.where(std > 0, std, 1.0)
    return Dataset(
        name=name,
        train_images=_normalize(x_train, scale, mean, safe_std),
        train_labels=y_train,
        test_images=_normalize(x_test, scale, mean, safe_std),
        test_labels=y_test,
        num_classes=int(num_classes),
        mean=tuple(float(m) for m in mean),
        std=tuple(float(s) for s in std),
        class_names=tuple(class_names),
    )


def split_by_seed(
    images: np.ndarray, labels: np.ndarray, *, test_fraction: float, seed: int
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Deterministic train/test split: a seeded permutation, the first part becomes test."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}.")
    n = images.shape[0]
    n_test = int(round(n * test_fraction))
    if n_test < 1 or n_test >= n:
        raise DataError(
            f"Cannot split {n} examples with test_fraction={test_fraction}: each split needs "
            f"at least one example."
        )
    perm = np.random.default_rng([seed, n]).permutation(n)
    test_idx, train_idx = np.sort(perm[:n_test]), np.sort(perm[n_test:])
    return (images[train_idx], labels[train_idx]), (images[test_idx], labels[test_idx])
