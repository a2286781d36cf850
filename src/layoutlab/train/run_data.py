"""The data set of a run: ``load_run_data(config)``, and what its data was read from.

Training, autotuning, evaluation and prediction all load a run's data through
``load_run_data``, so a folder of mixed-size images is resized the same way in each.
This module imports no JAX (``layoutlab train --help`` reads the config module).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from layoutlab.data import Dataset
    from layoutlab.train.config import TrainConfig

__all__ = [
    "data_change",
    "load_run_data",
    "with_data_fingerprint",
]


def load_run_data(config: TrainConfig) -> Dataset:
    """The run's data set, as training, autotuning, evaluation and prediction all load it:
    the split is drawn with seed 0 (not the training seed), so every seed of a run family
    trains and is evaluated on the same split; with ``val_fraction`` its validation split is
    held out of the train split (``data.validation.with_validation``)."""
    from layoutlab.data import get_dataset

    size = None if config.image_size is None else tuple(config.image_size)
    dataset = get_dataset(config.data, image_size=size)
    if config.val_fraction:
        # Seed 0 too: every seed of a run family is validated on the same images.
        from layoutlab.data.validation import with_validation

        dataset = with_validation(dataset, config.val_fraction)
    return dataset


def _current_keys(recorded):
    """A recorded fingerprint in today's keys: a run started before the data source got its
    name recorded generated data as ``{"spec": ...}``, the same as ``{"source": ...}``."""
    if isinstance(recorded, dict) and "spec" in recorded and "source" not in recorded:
        return {("source" if k == "spec" else k): v for k, v in recorded.items()}
    return recorded


def _what_changed(recorded: dict, have: dict) -> str:
    if "source" in recorded:
        return f"it is generated from {have.get('source')!r} now, {recorded['source']!r} then"
    was, now = recorded.get("each"), have.get("each")
    if isinstance(was, dict) and isinstance(now, dict):
        parts = []
        for what, names in (
            ("changed", [n for n in sorted(was) if n in now and was[n] != now[n]]),
            ("added", sorted(set(now) - set(was))),
            ("removed", sorted(set(was) - set(now))),
        ):
            if names:
                parts.append(f"{', '.join(names)} {what}")
        return "; ".join(parts) + " since the run started"
    what = []
    for key, unit in (("files", "files"), ("bytes", "bytes")):
        if have.get(key) != recorded.get(key):
            what.append(f"{have.get(key)} {unit} now, {recorded.get(key)} when the run started")
    return "; ".join(what) or "as many files of the same sizes, but other contents or names"


def data_change(config: TrainConfig, recorded: dict | None, have: dict | None) -> str | None:
    """None when the data read now (fingerprint ``have``) is what ``recorded`` describes
    (every entry ``recorded`` holds is ``have``'s: a run recorded before per-file digests
    compares by the rest), or nothing was recorded (a run from before fingerprints), else
    one sentence naming what changed and the fix."""
    recorded = _current_keys(recorded)
    if recorded is None or recorded == have:
        return None
    if not isinstance(have, dict) or not isinstance(recorded, dict):
        what = "it has no fingerprint now"
    elif have.get("split") != recorded.get("split"):
        return (
            f"The run was trained on the random train/test split that earlier versions drew "
            f"of {config.data!r}; its split is now drawn per class (stratified), so its test "
            "images would change. Finish the run with the version that started it, or train "
            "again in a new workdir."
        )
    elif all(have.get(k) == v for k, v in recorded.items()):
        return None
    else:
        what = _what_changed(recorded, have)
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
