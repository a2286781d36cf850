"""The data a run reads is the data it was trained on (issue 70): 16-bit images are scaled,
never clipped, by the folder loader and ``predict`` alike, and every data source has a
fingerprint that a resume compares.
"""

import gzip
import json
import shutil

import numpy as np
import pytest
from PIL import Image
from test_data_sources import _write_cifar10, _write_mnist
from test_train_guarantees import LEVEL_0, _one_line_error

from layoutlab import cli
from layoutlab.data import digits, get_dataset
from layoutlab.data.errors import DataError
from layoutlab.data.folder import load_folder
from layoutlab.infer.predict import load_images
from layoutlab.train.config import TrainConfig
from layoutlab.train.fingerprint import run_fingerprint
from layoutlab.train.run_data import data_change

TINY = ["--set", "model_kwargs.width=4", "--set", "model_kwargs.hidden=16"]

# -- item 3: 16-bit images --------------------------------------------------------------------


def _sixteen_bit_folder(root, rng):
    """A pre-split folder of 16-bit grayscale PNGs (one 8-bit PNG among the test images);
    returns each split's pixels in [0, 1], in the loader's order (class, then name)."""
    want = {"train": [], "test": []}
    for split in want:
        for name in ("a", "b"):
            (root / split / name).mkdir(parents=True)
            for i in range(3):
                pixels = rng.integers(0, 65536, (5, 4), dtype=np.uint16)
                Image.fromarray(pixels).save(root / split / name / f"{i}.png")
                with Image.open(root / split / name / f"{i}.png") as saved:
                    assert saved.mode == "I;16"
                want[split].append(pixels / 65535.0)
    eight = rng.integers(0, 256, (5, 4), dtype=np.uint8)
    Image.fromarray(eight).save(root / "test" / "b" / "3.png")
    want["test"].append(eight / 255.0)
    return {k: np.stack(v)[..., None] for k, v in want.items()}


def test_sixteen_bit_images_are_scaled_not_clipped(tmp_path):
    want = _sixteen_bit_folder(tmp_path, np.random.default_rng(0))
    dataset = load_folder(tmp_path)
    for split in ("train", "test"):
        images, _ = dataset.split(split)
        unnormalized = images * np.float32(dataset.std[0]) + np.float32(dataset.mean[0])
        # Against float64 pixel / 65535 (8-bit: / 255): float32 normalization and its inverse
        # round a value in [0, 1] a few times, each within 2**-24; clipping at 255 of 65535
        # would be off by up to 1.
        np.testing.assert_allclose(unnormalized, want[split], rtol=0, atol=1e-6)
    assert np.isclose(dataset.mean[0], want["train"].mean(), rtol=1e-12)
    assert dataset.pixel_bits == 16
    # predict reads the same files into the same arrays, bit for bit.
    files = sorted((tmp_path / "test").rglob("*.png"))
    np.testing.assert_array_equal(load_images(files, dataset), dataset.test_images)
    # Resized in float, not clipped either: a uniform image keeps its value.
    Image.fromarray(np.full((5, 4), 40000, np.uint16)).save(tmp_path / "flat.png")
    flat = load_folder(tmp_path, image_size=(3, 2))
    resized = load_images([tmp_path / "flat.png"], flat)[0]
    np.testing.assert_allclose(resized * flat.std[0] + flat.mean[0], 40000 / 65535, atol=1e-6)


def test_predict_scales_a_sixteen_bit_file_for_an_eight_bit_run(tmp_path):
    for name in ("a", "b"):
        (tmp_path / "data" / name).mkdir(parents=True)
        for i in range(3):
            pixels = np.full((4, 4), 60 * i, np.uint8)
            Image.fromarray(pixels).save(tmp_path / "data" / name / f"{i}.png")
    dataset = load_folder(tmp_path / "data")
    Image.fromarray(np.full((4, 4), 32896, np.uint16)).save(tmp_path / "deep.png")  # 128 * 257
    Image.fromarray(np.full((4, 4), 128, np.uint8)).save(tmp_path / "eight.png")
    deep, eight = load_images([tmp_path / "deep.png", tmp_path / "eight.png"], dataset)
    # 32896 / 65535 is 128 / 255 exactly; float32 scaling rounds each within a few ulps.
    np.testing.assert_allclose(deep, eight, rtol=0, atol=1e-6)
    assert dataset.pixel_bits == 8


def test_images_of_unknown_range_are_refused_naming_file_and_mode(tmp_path):
    Image.fromarray(np.zeros((4, 4), np.float32), "F").save(tmp_path / "float.tif")
    Image.fromarray(np.full((4, 4), 70000, np.int32), "I").save(tmp_path / "wide.tif")
    digits_run = get_dataset("digits")
    with pytest.raises(DataError, match=r"float\.tif has Pillow mode F .*8- or 16-bit PNG"):
        load_images([tmp_path / "float.tif"], digits_run)
    with pytest.raises(DataError, match=r"wide\.tif has Pillow mode I .*beyond 16 bits"):
        load_images([tmp_path / "wide.tif"], digits_run)


# -- item 5: every data source has a fingerprint ----------------------------------------------


def test_resume_on_changed_mnist_labels_is_refused(tmp_path, capsys):
    data = tmp_path / "mnist"
    _write_mnist(data, np.random.default_rng(0), gz=False, n_train=24, n_test=8)
    workdir = tmp_path / "run"
    argv = ["train", "--workdir", str(workdir), "--data", f"mnist:{data}", "--quiet"]
    assert cli.main([*argv, "--steps", "1", "--batch-size", "8", *TINY, *LEVEL_0]) == 0
    recorded = json.loads((workdir / "config.json").read_text())["data_fingerprint"]
    capsys.readouterr()
    labels = data / "train-labels-idx1-ubyte"
    raw = bytearray(labels.read_bytes())
    raw[8:] = bytes((b + 1) % 10 for b in raw[8:])  # every label shifted, same size
    labels.write_bytes(bytes(raw))
    code = cli.main(["train", "--workdir", str(workdir), "--resume", "--steps", "2"])
    assert code == 2
    _one_line_error(capsys.readouterr().err, "train-labels-idx1-ubyte changed since the run")
    assert recorded["files"] == 4 and set(recorded["each"]) >= {"train-labels-idx1-ubyte"}


def test_built_in_digits_file_is_fingerprinted(tmp_path, monkeypatch):
    shipped = digits._digits_file()
    config = TrainConfig()
    recorded = get_dataset("digits").fingerprint
    assert recorded["files"] == 1 and recorded["each"]
    copy = tmp_path / "digits.csv.gz"
    shutil.copy(shipped, copy)
    monkeypatch.setattr(digits, "_digits_file", lambda: copy)
    assert data_change(config, recorded, get_dataset("digits").fingerprint) is None
    rows = gzip.decompress(copy.read_bytes()).decode().splitlines()
    last = rows[0].rsplit(",", 1)
    rows[0] = f"{last[0]},{(int(float(last[1])) + 1) % 10}"  # the first image's label
    copy.write_bytes(gzip.compress("\n".join(rows).encode()))
    change = data_change(config, recorded, get_dataset("digits").fingerprint)
    assert change is not None and "digits.csv.gz changed since the run started" in change


def test_cifar_and_synthetic_are_fingerprinted(tmp_path):
    _write_cifar10(tmp_path / "c", np.random.default_rng(1))
    config = TrainConfig(data=f"cifar10:{tmp_path / 'c'}")
    recorded = get_dataset(config.data).fingerprint
    assert recorded["files"] == 7
    _write_cifar10(tmp_path / "c", np.random.default_rng(2))  # other images and labels
    change = data_change(config, recorded, get_dataset(config.data).fingerprint)
    assert "data_batch_1" in change and "test_batch" in change
    small, large = (get_dataset(f"synthetic:4x4x1:2:{n}").fingerprint for n in (10, 12))
    assert small["source"].startswith("synthetic:4x4x1:2:10")
    change = data_change(TrainConfig(data="synthetic"), small, large)
    assert "generated from 'synthetic:4x4x1:2:12" in change


def test_a_synthetic_run_recorded_before_the_rename_still_resumes(tmp_path):
    """Generated data was fingerprinted ``{"spec": ...}`` before the data source got its name
    (issue 68): a run whose config.json says so resumes, records ``{"source": ...}`` from then
    on, and still refuses other generated data by name."""
    from layoutlab.train.config import validate
    from layoutlab.train.resume import check_resume
    from layoutlab.train.run_data import with_data_fingerprint
    from layoutlab.train.spec import resolve_spec

    config = TrainConfig(data="synthetic:4x4x1:2:10", model_kwargs={"width": 4, "hidden": 16})
    config = with_data_fingerprint(validate(config, 1), get_dataset(config.data))
    generated, spec = config.data_fingerprint["source"], resolve_spec(config)
    old = {**spec.config.to_dict(), "data_fingerprint": {"spec": generated}}  # as config.json was
    (tmp_path / "config.json").write_text(json.dumps(old))
    resumed = check_resume(spec, tmp_path, tmp_path / "checkpoints").config
    assert resumed.data_fingerprint == {"source": generated}
    other = get_dataset("synthetic:4x4x1:2:12").fingerprint
    change = data_change(config, {"spec": generated}, other)
    assert f"generated from {other['source']!r} now, {generated!r} then" in change


def test_the_agreement_compares_the_fingerprint_instead_of_hashing_again():
    from flax import nnx

    from layoutlab.train.config import validate
    from layoutlab.train.loop import make_step_schedule
    from layoutlab.train.program import build_model
    from layoutlab.train.spec import InputSpec, resolve_spec

    config = validate(TrainConfig(model_kwargs={"width": 4, "hidden": 16}), 1)
    dataset = get_dataset("digits")
    spec = resolve_spec(config)
    model = nnx.eval_shape(lambda: build_model(spec, InputSpec.of(dataset, spec.batch_size)))
    fields = run_fingerprint(spec, dataset, make_step_schedule(config, dataset), model)
    assert fields["data.contents"] == dataset.fingerprint["sha256"]
