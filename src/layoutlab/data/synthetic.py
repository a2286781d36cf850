"""Deterministic random images of any shape with learnable class structure, for benchmarks.

Each class has a smooth random prototype (a coarse 4x4 grid of colours blown up to HxW); an
example is its class prototype plus pixel noise, so a small model can learn the classes while
every pixel still varies.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from layoutlab.data.dataset import Dataset, make_dataset, split_by_seed
from layoutlab.data.fingerprint import source_fingerprint
from layoutlab.data.memory import check_fits, peak_bytes

__all__ = ["make_synthetic"]

_GRID = 4
_NOISE = 0.25


def _prototypes(rng: np.random.Generator, classes: int, h: int, w: int, c: int) -> np.ndarray:
    coarse = rng.random((classes, _GRID, _GRID, c), dtype=np.float32)
    rows = np.minimum(np.arange(h) * _GRID // h, _GRID - 1)
    cols = np.minimum(np.arange(w) * _GRID // w, _GRID - 1)
    return coarse[:, rows][:, :, cols]


def make_synthetic(
    image_shape: tuple[int, int, int] = (32, 32, 3),
    num_classes: int = 10,
    num_examples: int = 1280,
    *,
    seed: int = 0,
    test_fraction: float = 0.2,
) -> Dataset:
    """``num_examples`` random ``(H, W, C)`` images in ``num_classes`` classes, split by seed."""
    h, w, c = (int(s) for s in image_shape)
    if min(h, w, c) < 1 or num_classes < 1 or num_examples < 2:
        raise ValueError(
            f"synthetic needs positive H, W, C, classes >= 1 and >= 2 examples; got shape "
            f"{image_shape}, {num_classes} classes, {num_examples} examples."
        )
    # A float32 prototype per class, and the images.
    need = peak_bytes(num_examples, (h, w, c)) + peak_bytes(num_classes, (h, w, c)) // 2
    check_fits(
        f"synthetic:{h}x{w}x{c}:{num_classes}:{num_examples}",
        f"{num_examples} images and {num_classes} class prototypes of {h}x{w}x{c}",
        need,
        "use fewer classes or examples (synthetic:HxWxC:CLASSES:N) or smaller images",
    )
    rng = np.random.default_rng(seed)
    protos = _prototypes(rng, num_classes, h, w, c)
    labels = rng.integers(0, num_classes, num_examples).astype(np.int32)
    images = rng.standard_normal((num_examples, h, w, c), dtype=np.float32)
    images *= np.float32(_NOISE)
    images += protos[labels]
    train, test = split_by_seed(images, labels, test_fraction=test_fraction, seed=seed)
    name = f"synthetic:{h}x{w}x{c}:{num_classes}:{num_examples}"
    dataset = make_dataset(name, train, test, num_classes=num_classes, scale=1.0)
    source = f"{name}:seed={seed}:test_fraction={test_fraction}"
    return dataclasses.replace(dataset, fingerprint=source_fingerprint(source))
