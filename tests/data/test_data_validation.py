"""Stratified splits: the validation split held out of a run's train split (``val_fraction``)
and an image folder's own train/test split."""

import numpy as np
import pytest
from PIL import Image

from layoutlab.data import get_dataset
from layoutlab.data.errors import DataError
from layoutlab.data.validation import stratified_indices
from layoutlab.train.config import TrainConfig
from layoutlab.train.run_data import data_change, load_run_data


def _counts(labels, classes):
    return np.bincount(labels, minlength=classes)


def test_val_split_holds_out_the_fraction_of_every_class_and_nothing_else():
    whole = get_dataset("digits")
    d = load_run_data(TrainConfig(val_fraction=0.1))
    have = _counts(whole.train_labels, 10)
    assert _counts(d.val_labels, 10).tolist() == [round(n * 0.1) for n in have]
    assert (_counts(d.train_labels, 10) + _counts(d.val_labels, 10)).tolist() == have.tolist()
    # Disjoint and complete: every train image is in exactly one of the two parts.
    rows = {r.tobytes() for r in whole.train_images.reshape(-1, 64)}
    train = {r.tobytes() for r in d.train_images.reshape(-1, 64)}
    val = {r.tobytes() for r in d.val_images.reshape(-1, 64)}
    assert not train & val and train | val == rows
    assert np.array_equal(d.test_labels, whole.test_labels)  # the test split is untouched


def test_val_split_is_the_same_for_any_seed_layout_and_device_count():
    base = load_run_data(TrainConfig(val_fraction=0.2))
    for other in (
        TrainConfig(val_fraction=0.2, seed=7, layout="NCHW"),
        TrainConfig(val_fraction=0.2, data_parallel=True, batch_size=64),
    ):
        d = load_run_data(other)
        assert np.array_equal(d.val_images, base.val_images)
        assert np.array_equal(d.train_images, base.train_images)


def test_a_class_left_without_a_held_out_or_remaining_example_is_named():
    labels = np.array([0] * 20 + [1] * 2)
    with pytest.raises(DataError, match=r"class 'b' \(1\) \(2 examples\) with no held-out"):
        stratified_indices(labels, 0.1, seed=0, what="val_fraction", names=("a", "b"))
    with pytest.raises(DataError, match="no remaining example; lower val_fraction"):
        stratified_indices(labels, 0.8, seed=0, what="val_fraction")


def _folder(root, sizes):
    for c, n in enumerate(sizes):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(n):
            Image.fromarray(np.full((4, 4), 10 * c + i, np.uint8)).save(root / f"c{c}/{i}.png")


def test_a_folder_is_split_per_class(tmp_path):
    """Three classes of 5 images at test_fraction 0.2: one test image of each (the random
    split of before drew 3 of the 15 images, here two of one class and none of another)."""
    _folder(tmp_path, [5, 5, 5])
    d = get_dataset(f"folder:{tmp_path}")
    assert _counts(d.test_labels, 3).tolist() == [1, 1, 1]
    assert _counts(d.train_labels, 3).tolist() == [4, 4, 4]
    assert d.fingerprint["split"] == "stratified"


def test_a_folder_run_from_the_random_split_is_not_resumed_on_the_new_one(tmp_path):
    _folder(tmp_path, [5, 5])
    have = get_dataset(f"folder:{tmp_path}").fingerprint
    recorded = {k: v for k, v in have.items() if k != "split"}  # a run of an earlier version
    why = data_change(TrainConfig(data=f"folder:{tmp_path}"), recorded, have)
    assert "random train/test split" in why and "new workdir" in why
    assert data_change(TrainConfig(), have, have) is None
