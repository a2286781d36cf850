"""Deterministic batching that can start at any step, so a run killed mid-epoch resumes bitwise.

The order of epoch ``e`` is a permutation drawn from ``(seed, e)`` alone, so step ``s`` of
epoch ``e`` is the same batch whether the epoch is read from its start or from step ``s``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from layoutlab.data.dataset import Dataset
from layoutlab.data.errors import DataError
from layoutlab.layout import Layout, parse_layout
from layoutlab.precision import parse_dtype

__all__ = ["epoch_order", "epoch_batches", "steps_per_epoch", "train_batches"]


def _split_size(dataset: Dataset, split: str) -> int:
    return dataset.split(split)[0].shape[0]


def steps_per_epoch(
    dataset: Dataset, split: str, batch_size: int, *, drop_last: bool = True
) -> int:
    """Number of batches in one epoch of ``split``; errors if there is not one full batch."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    n = _split_size(dataset, split)
    if drop_last and n < batch_size:
        raise DataError(
            f"The {split} split of {dataset.name} has {n} examples, fewer than one batch of "
            f"{batch_size}; use batch_size <= {n} or drop_last=False."
        )
    return n // batch_size if drop_last else -(-n // batch_size)


def epoch_order(n: int, *, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """Example order of one epoch: a function of ``(seed, epoch)`` only."""
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng([seed, epoch]).permutation(n)


def _host_batch(
    images: np.ndarray, labels: np.ndarray, idx: np.ndarray, layout: Layout, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    x = images[idx]
    if not layout.is_channels_last:
        x = x.transpose(0, 3, 1, 2)
    # One copy does the gather's layout change and the dtype cast together.
    return np.ascontiguousarray(x, dtype=dtype), labels[idx]


def _check_layout(layout: Layout | str) -> Layout:
    layout = parse_layout(layout)
    if layout not in (Layout.NHWC, Layout.NCHW):
        raise ValueError(f"Image batches are NHWC or NCHW, got layout {layout.value}.")
    return layout


def epoch_batches(
    dataset: Dataset,
    split: str,
    batch_size: int,
    *,
    layout: Layout | str = Layout.NHWC,
    dtype="float32",
    seed: int = 0,
    epoch: int = 0,
    start_step: int = 0,
    shuffle: bool = True,
    drop_last: bool = True,
    rows: Sequence[tuple[int, int]] | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(images, labels)`` host batches of one epoch, from ``start_step`` on.

    ``images`` are in ``layout`` and ``dtype`` (float32, bfloat16 or float16), ``labels`` are
    int32. With ``drop_last=False`` the final batch may be smaller. ``rows`` (``[(start,
    stop), ...]``) keeps only those rows of every full batch, in that order: one process's
    part of a global batch, built without building the rest.
    """
    layout = _check_layout(layout)
    dtype = parse_dtype(dtype)
    steps = steps_per_epoch(dataset, split, batch_size, drop_last=drop_last)
    if not 0 <= start_step <= steps:
        raise ValueError(f"start_step must lie in [0, {steps}] for this epoch, got {start_step}.")
    images, labels = dataset.split(split)
    order = epoch_order(images.shape[0], seed=seed, epoch=epoch, shuffle=shuffle)
    def indices(s):
        idx = order[s * batch_size : (s + 1) * batch_size]
        if rows is None or idx.size < batch_size:  # a last partial batch goes to everyone
            return idx
        return np.concatenate([idx[a:b] for a, b in rows])

    batches = range(start_step, steps)
    return (_host_batch(images, labels, indices(s), layout, dtype) for s in batches)


def train_batches(
    dataset: Dataset,
    batch_size: int,
    *,
    layout: Layout | str = Layout.NHWC,
    dtype="float32",
    seed: int = 0,
    start_step: int = 0,
    num_steps: int | None = None,
    split: str = "train",
    rows: Sequence[tuple[int, int]] | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Endless shuffled full batches across epochs, starting at global step ``start_step``.

    Global step ``g`` is step ``g % steps_per_epoch`` of epoch ``g // steps_per_epoch``, so a
    run restored at step ``g`` sees the batches an uninterrupted run would have seen.
    ``num_steps`` stops after that many batches; ``rows`` as in ``epoch_batches``.
    """
    steps = steps_per_epoch(dataset, split, batch_size)
    layout, dtype = _check_layout(layout), parse_dtype(dtype)
    if start_step < 0:
        raise ValueError(f"start_step must be >= 0, got {start_step}.")
    if num_steps is not None and num_steps < 0:
        raise ValueError(f"num_steps must be >= 0 or None, got {num_steps}.")
    return _endless(
        dataset, split, batch_size, layout, dtype, seed, start_step, num_steps, steps, rows
    )


def _endless(dataset, split, batch_size, layout, dtype, seed, start_step, num_steps, steps, rows):
    epoch, step = divmod(start_step, steps)
    produced = 0
    while num_steps is None or produced < num_steps:
        for batch in epoch_batches(
            dataset,
            split,
            batch_size,
            layout=layout,
            dtype=dtype,
            seed=seed,
            epoch=epoch,
            start_step=step,
            rows=rows,
        ):
            if num_steps is not None and produced >= num_steps:
                return
            yield batch
            produced += 1
        epoch, step = epoch + 1, 0
