"""Stratified splits: ``stratified_indices`` holds out the same fraction of every class, and
``with_validation`` carves a run's validation split out of its train split that way.

A split is a function of the labels, the fraction and the seed only (not of the layout, the
device count or the order classes are met in): each class's indices are permuted by a
generator seeded with ``(seed, class, count)``, and the first ``round(count * fraction)``
of them are held out.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from layoutlab.data.dataset import Dataset
from layoutlab.data.errors import DataError

__all__ = ["stratified_indices", "with_validation"]


def stratified_indices(
    labels: np.ndarray,
    fraction: float,
    *,
    seed: int,
    what: str,
    names: tuple[str, ...] = (),
) -> tuple[np.ndarray, np.ndarray]:
    """``(kept, held)``: sorted indices of ``labels``, ``held`` taking ``round(n * fraction)``
    of each class's ``n`` examples. A class left with none on either side is a ``DataError``
    naming it and ``what`` (the field that set ``fraction``)."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"{what} must lie in (0, 1), got {fraction}.")
    labels = np.asarray(labels)
    kept, held = [], []
    for c in np.unique(labels):
        index = np.flatnonzero(labels == c)
        n, n_held = index.size, int(round(index.size * fraction))
        if n_held < 1 or n_held >= n:
            name = f"{names[c]!r} ({c})" if c < len(names) else str(c)
            fix = "raise" if n_held < 1 else "lower"
            side = "held-out" if n_held < 1 else "remaining"
            raise DataError(
                f"{what}={fraction} leaves class {name} ({n} examples) with no {side} example; "
                f"{fix} {what} or add examples to that class."
            )
        perm = np.random.default_rng([seed, int(c), n]).permutation(index)
        held.append(perm[:n_held])
        kept.append(perm[n_held:])
    return np.sort(np.concatenate(kept)), np.sort(np.concatenate(held))


def with_validation(dataset: Dataset, fraction: float, *, seed: int = 0) -> Dataset:
    """``dataset`` with ``fraction`` of each class of its train split moved to its
    validation split (``Dataset.split("val")``), drawn by ``stratified_indices``. The images
    keep the normalization of the train split they were loaded as."""
    kept, held = stratified_indices(
        dataset.train_labels, fraction, seed=seed, what="val_fraction", names=dataset.class_names
    )
    return dataclasses.replace(
        dataset,
        train_images=dataset.train_images[kept],
        train_labels=dataset.train_labels[kept],
        val_images=dataset.train_images[held],
        val_labels=dataset.train_labels[held],
    )
