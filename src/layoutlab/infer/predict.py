"""``predict``: top-k classes of image files under a trained run's model.

Images are prepared as the folder loader prepares training data (``layoutlab.data.folder``,
through the same ``data.pixels.read_pixels``): converted to the model's channels (1 or 3),
resized bilinearly to the run's image size when they differ, scaled to ``[0, 1]`` (8-bit
pixels / 255, or for a run of 16-bit images every pixel in 16-bit units / 65535; a 16-bit
image is scaled, never clipped) and normalized
with the run's train-split mean and std, with the same float32 operations as
``layoutlab.data.dataset``. So a folder-trained run sees its own test images bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from layoutlab.data import Dataset
from layoutlab.data.folder import IMAGE_SUFFIXES
from layoutlab.data.pixels import DEEP_MAX, read_pixels
from layoutlab.infer.load import Run, class_names
from layoutlab.layout import to_layout
from layoutlab.train.evaluation import eval_batches, pad_rows

__all__ = ["collect_images", "load_images", "predict_files", "top_k"]

_CHANNELS = (1, 3)


def collect_images(paths: list[str | Path]) -> list[Path]:
    """Files as given, and the image files (by suffix, sorted) of directories, recursively."""
    files: list[Path] = []
    for item in map(Path, paths):
        if item.is_dir():
            found = sorted(p for p in item.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise FileNotFoundError(
                    f"{item} holds no images ({', '.join(IMAGE_SUFFIXES)}); pass image files "
                    "or a folder of them."
                )
            files += found
        elif item.is_file():
            files.append(item)
        else:
            raise FileNotFoundError(f"No image file or folder {item}; check the path.")
    if not files:
        raise FileNotFoundError("No images given; pass image files or a folder of them.")
    return files


def load_images(files: list[Path], dataset: Dataset) -> np.ndarray:
    """``files`` as normalized NHWC float32, in the shape and statistics of ``dataset``."""
    h, w, c = dataset.image_shape
    if c not in _CHANNELS:
        raise ValueError(
            f"The run's images have {c} channels; predict reads 1 (grayscale) or 3 (RGB)."
        )
    deep = dataset.pixel_bits == 16  # the run's images were read in 16-bit units
    raw = np.stack([read_pixels(p, c == 1, (h, w), deep) for p in files])
    mean = np.asarray(dataset.mean, np.float64)
    std = np.asarray(dataset.std, np.float64)
    std = np.where(std > 0, std, 1.0)  # as make_dataset: a constant channel divides by 1
    # The float32 steps of layoutlab.data.dataset._normalize, in its order.
    out = raw.astype(np.float32)
    out *= np.float32(1.0 / (DEEP_MAX if deep else 255.0))
    out -= mean.astype(np.float32)
    out *= (1.0 / std).astype(np.float32)
    return out


def top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(classes, probabilities)`` of the ``k`` best classes per row, best first."""
    logits = np.asarray(logits, np.float64)
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = shifted / shifted.sum(axis=-1, keepdims=True)
    # Stable sort: ties go to the lower class, as argmax does.
    classes = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    return classes, np.take_along_axis(probs, classes, axis=-1)


def _check_finite(logits: np.ndarray, run: Run, files: list[Path]) -> None:
    """NaN probabilities are no answer: a model whose outputs are not finite (a diverged
    run's checkpoint) is an error naming the checkpoint."""
    bad = ~np.isfinite(logits).all(axis=tuple(range(1, logits.ndim)))
    if bad.any():
        raise ValueError(
            f"the model of {run.workdir} at step {run.step} gives non-finite outputs (NaN or "
            f"inf logits) for {int(bad.sum())} of {len(files)} images, the first "
            f"{files[bad.argmax()]}: the run diverged; train it again with a lower --lr, or "
            "try an earlier --checkpoint."
        )


def _logits(run: Run, files: list[Path], batch: int) -> np.ndarray:
    """float32 logits of ``files``, run as one batch of ``batch`` rows (zero-padded)."""
    images = pad_rows(load_images(files, run.dataset), batch)
    out = run.logits(to_layout(images, "NHWC", run.config.layout))
    return np.asarray(jax.device_get(out), np.float32)[: len(files)]


def predict_files(
    run: Run, paths: list[str | Path], k: int = 5, *, batch_size: int | None = None
) -> list[dict]:
    """Top-``k`` predictions for each image file (or folder of images) in ``paths``, read and
    run ``batch_size`` files at a time at most (None: the run's ``eval_batch_size``)."""
    if k < 1:
        raise ValueError(f"--top-k must be at least 1, got {k}.")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {batch_size}.")
    names = class_names(run.dataset)
    if k > len(names):
        raise ValueError(
            f"--top-k {k} is more than the run's {len(names)} classes; use --top-k "
            f"{len(names)} or less."
        )
    files = collect_images(paths)
    # Equal chunks of at most the batch size, the last padded with zero images whose logits
    # are dropped: one batch shape, so one compile and one conv plan. Files are read chunk by
    # chunk, so memory holds one batch of images however many files there are.
    chunk = eval_batches(len(files), batch_size or run.spec.eval_batch_size)[1]
    logits = np.concatenate(
        [_logits(run, files[i : i + chunk], chunk) for i in range(0, len(files), chunk)]
    )
    _check_finite(logits, run, files)
    classes, probs = top_k(logits, k)
    return [
        {
            "file": str(f),
            "top_k": [
                {"class": int(c), "name": names[c], "probability": float(p)}
                for c, p in zip(cls, prob, strict=True)
            ],
        }
        for f, cls, prob in zip(files, classes, probs, strict=True)
    ]
