"""The data set of a run: ``image_size`` in its forms, and ``load_run_data(config)``.

Training, autotuning, evaluation and prediction all load a run's data through
``load_run_data``, so a folder of mixed-size images is resized the same way in each.
This module imports no JAX (``layoutlab train --help`` reads the config module).
"""

from __future__ import annotations

from argparse import ArgumentTypeError
from typing import TYPE_CHECKING

from layoutlab.arguments import parse_image_size as parse_image_size_flag

if TYPE_CHECKING:
    from layoutlab.data import Dataset
    from layoutlab.train.config import TrainConfig

__all__ = [
    "data_change",
    "image_size_value",
    "load_run_data",
    "parse_image_size",
    "with_data_fingerprint",
]


def image_size_value(value) -> list:
    """``64`` or ``(64, 48)`` -> ``[64, 64]`` / ``[64, 48]``; anything else is an error."""
    sizes = [value, value] if isinstance(value, int) else value
    ok = isinstance(sizes, (list, tuple)) and len(sizes) == 2
    ok = ok and all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes)
    if not ok:
        raise ValueError(
            f"image_size must be a positive integer or [H, W] of positive integers, got "
            f"{value!r}; e.g. image_size=64 or image_size=64,48."
        )
    return list(sizes)


def parse_image_size(text: str) -> list:
    """``64``, ``64,48``, ``64x48`` (the ``--image-size`` forms, ``arguments.parse_image_size``)
    or ``[64, 48]`` (``--set`` text) -> ``[H, W]``."""
    inner = text.strip()
    if inner.startswith("[") and inner.endswith("]"):
        inner = inner[1:-1]
    try:
        return image_size_value(list(parse_image_size_flag(inner) * 2)[:2])
    except ArgumentTypeError:
        raise ValueError(
            f"Bad value for image_size: {text!r} is not H,W, HxW or one size (e.g. 64 or 64,48)."
        ) from None


def load_run_data(config: TrainConfig) -> Dataset:
    """The run's data set, as training, autotuning, evaluation and prediction all load it:
    the split is drawn with seed 0 (not the training seed), so every seed of a run family
    trains and is evaluated on the same split."""
    from layoutlab.data import get_dataset

    size = None if config.image_size is None else tuple(config.image_size)
    return get_dataset(config.data, image_size=size)


def data_change(config: TrainConfig, recorded: dict | None, have: dict | None) -> str | None:
    """None when the data read now (fingerprint ``have``) is what ``recorded`` describes (or
    nothing was recorded: built-in data, runs from before fingerprints), else one sentence
    naming what changed and the fix."""
    if recorded is None or recorded == have:
        return None
    if not isinstance(have, dict) or not isinstance(recorded, dict):
        what = "it has no fingerprint now"
    else:
        what = []
        for key, unit in (("files", "files"), ("bytes", "bytes")):
            if have.get(key) != recorded.get(key):
                what.append(f"{have.get(key)} {unit} now, {recorded.get(key)} when the run started")
        what = "; ".join(what) or "as many files of the same sizes, but other contents or names"
    return (
        f"The training data {config.data!r} is not what the run was trained on ({what}). "
        "Restore that data, or train on the new data in a new workdir."
    )


def with_data_fingerprint(config: TrainConfig, dataset: Dataset) -> TrainConfig:
    """``config`` recording what its data was read from now. A value it carried (a config.json
    given to ``--config``) is replaced: the fingerprint describes a run's own data, and only a
    resume compares it (``train.resume.check_resume``)."""
    import dataclasses

    return dataclasses.replace(config, data_fingerprint=dataset.fingerprint)
