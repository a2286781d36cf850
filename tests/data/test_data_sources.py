"""Loaders on small files written here in the real formats, good and broken."""

import gzip
import os
import pickle

import numpy as np
import pytest
from PIL import Image

from layoutlab.data import (
    DataError,
    get_dataset,
    load_cifar10,
    load_fashion_mnist,
    load_folder,
    load_mnist,
    make_dataset,
    make_synthetic,
    read_idx,
)

# Normalized pixels are float32 computed from float64 stats; undoing the normalization in
# float64 recovers the raw pixels to float32 rounding of values of size ~|x| <= 1/std ~ 5.
UNDO_ATOL = 1e-5


def _undo(dataset, images):
    return images.astype(np.float64) * np.asarray(dataset.std) + np.asarray(dataset.mean)


def _check_normalized(dataset, raw_train01, raw_test01):
    """Stats against float64 NumPy on the raw train pixels; both splits use them."""
    mean = raw_train01.mean(axis=(0, 1, 2))
    std = raw_train01.std(axis=(0, 1, 2))
    # Stats come from float64 sums over a few thousand values: agreement to 1e-9.
    np.testing.assert_allclose(dataset.mean, mean, rtol=0, atol=1e-9)
    np.testing.assert_allclose(dataset.std, std, rtol=0, atol=1e-9)
    assert dataset.train_images.dtype == np.float32 and dataset.train_labels.dtype == np.int32
    np.testing.assert_allclose(_undo(dataset, dataset.train_images), raw_train01, atol=UNDO_ATOL)
    np.testing.assert_allclose(_undo(dataset, dataset.test_images), raw_test01, atol=UNDO_ATOL)


# ------------------------------------------------------- digits / synthetic / data source


def test_digits_default_split_and_stats():
    from sklearn.datasets import load_digits as sk_digits

    ds = get_dataset("digits", seed=3)
    assert ds.image_shape == (8, 8, 1) and ds.num_classes == 10
    assert ds.train_images.shape[0] + ds.test_images.shape[0] == 1797
    assert ds.test_images.shape[0] == round(1797 * 0.2)
    raw = sk_digits().images.astype(np.float64)[..., None] / 16.0
    # The split must partition the data set: every raw image appears exactly once.
    restored = np.concatenate([_undo(ds, ds.train_images), _undo(ds, ds.test_images)])
    key = lambda a: np.round(a.reshape(a.shape[0], -1) * 16).astype(np.int64)  # noqa: E731
    assert sorted(map(tuple, key(restored))) == sorted(map(tuple, key(raw)))
    again = get_dataset("digits", seed=3)
    np.testing.assert_array_equal(again.test_labels, ds.test_labels)
    # Read from sklearn's CSV without importing sklearn: its load_digits, row for row.
    from layoutlab.data.digits import digits_table

    table, bunch = digits_table()[0], sk_digits()
    np.testing.assert_array_equal(table[:, :-1].reshape(-1, 8, 8), bunch.images)
    np.testing.assert_array_equal(table[:, -1], bunch.target)
    other = get_dataset("digits", seed=4)
    assert not np.array_equal(other.test_labels, ds.test_labels)


def test_synthetic_source_shape_determinism_and_structure():
    a = get_dataset("synthetic:6x5x2:3:40", seed=1)
    assert a.image_shape == (6, 5, 2) and a.num_classes == 3
    assert a.train_images.shape[0] + a.test_images.shape[0] == 40
    b = get_dataset("synthetic:6x5x2:3:40", seed=1)
    np.testing.assert_array_equal(a.train_images, b.train_images)
    assert get_dataset("synthetic").image_shape == (32, 32, 3)
    # Learnable: nearest class-mean classification on the train split beats chance by far.
    ds = make_synthetic((8, 8, 3), 4, 200, seed=0)
    x = ds.train_images.reshape(ds.train_images.shape[0], -1)
    centers = np.stack([x[ds.train_labels == k].mean(0) for k in range(4)])
    pred = np.argmin(((x[:, None, :] - centers[None]) ** 2).sum(-1), axis=1)
    assert (pred == ds.train_labels).mean() > 0.9


@pytest.mark.parametrize(
    "source", ["imagenet", "cifar10", "digits:extra", "synthetic:32x32", "synthetic:a:b", ""]
)
def test_bad_source_lists_valid_forms(source):
    with pytest.raises(ValueError, match="Bad data source .*valid forms are") as info:
        get_dataset(source)
    assert "cifar10:DIR" in str(info.value) and "synthetic" in str(info.value)
    assert "\n" not in str(info.value)  # the CLI's one `error:` line


def test_the_old_spec_names_still_resolve_with_a_warning_naming_the_new_one():
    """Issue 68: a data source was called a spec; each old name gives the new one's object
    (still importable) and a DeprecationWarning that says what to use instead."""
    import layoutlab.data
    from layoutlab.data import source, source_forms, spec, spec_forms

    old = [
        (spec, "get_dataset", source.get_dataset, "layoutlab.data.source.get_dataset"),
        (spec, "SPEC_FORMS", source_forms.SOURCE_FORMS, "layoutlab.data.source_forms.SOURCE_FORMS"),
        (spec_forms, "known_image_shape", source_forms.known_image_shape, "source_forms."),
        (layoutlab.data, "SPEC_FORMS", source_forms.SOURCE_FORMS, "layoutlab.data.SOURCE_FORMS"),
    ]
    for module, name, new, says in old:
        with pytest.warns(DeprecationWarning, match=f"{module.__name__}.{name} is deprecated") as w:
            assert getattr(module, name) is new
        assert says in str(w[0].message) and w[0].filename == __file__
    assert "SPEC_FORMS" not in dir(layoutlab.data)
    with pytest.raises(TypeError, match="unexpected keyword argument 'spec'"):
        get_dataset(spec="digits")  # by position only, so the name can never break a caller


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "mnist", "fashion_mnist", "folder"])
def test_missing_directory(tmp_path, name):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        get_dataset(f"{name}:{tmp_path / 'nowhere'}")


# ---------------------------------------------------------------- CIFAR


def _cifar_rows(images):
    return images.transpose(0, 3, 1, 2).reshape(images.shape[0], -1)


def _dump(path, obj):
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def _write_cifar10(root, rng, per_batch=3, n_test=4):
    root.mkdir(parents=True, exist_ok=True)
    train = rng.integers(0, 256, (5 * per_batch, 32, 32, 3), dtype=np.uint8)
    train_labels = rng.integers(0, 10, 5 * per_batch)
    for i in range(5):
        part = slice(i * per_batch, (i + 1) * per_batch)
        rows = _cifar_rows(train[part])
        _dump(root / f"data_batch_{i + 1}", {b"data": rows, b"labels": train_labels[part].tolist()})
    test = rng.integers(0, 256, (n_test, 32, 32, 3), dtype=np.uint8)
    test_labels = rng.integers(0, 10, n_test)
    _dump(root / "test_batch", {b"data": _cifar_rows(test), b"labels": test_labels.tolist()})
    names = [f"c{k}".encode() for k in range(10)]
    _dump(root / "batches.meta", {b"label_names": names})
    return train, train_labels, test, test_labels


def test_cifar10_pixels_labels_and_stats(tmp_path):
    rng = np.random.default_rng(0)
    train, train_labels, test, test_labels = _write_cifar10(tmp_path / "cifar-10-batches-py", rng)
    ds = load_cifar10(tmp_path)  # the parent of the extracted folder works too
    assert ds.image_shape == (32, 32, 3) and ds.class_names[3] == "c3"
    np.testing.assert_array_equal(ds.train_labels, train_labels)
    np.testing.assert_array_equal(ds.test_labels, test_labels)
    _check_normalized(ds, train / 255.0, test / 255.0)


def test_cifar100_fine_labels(tmp_path):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (5, 32, 32, 3), dtype=np.uint8)
    labels = [0, 99, 42, 7, 42]
    for name in ("train", "test"):
        _dump(
            tmp_path / name,
            {b"data": _cifar_rows(images), b"fine_labels": labels, b"coarse_labels": [0] * 5},
        )
    _dump(tmp_path / "meta", {b"fine_label_names": [f"f{k}".encode() for k in range(100)]})
    ds = get_dataset(f"cifar100:{tmp_path}")
    assert ds.num_classes == 100 and ds.class_names[99] == "f99"
    np.testing.assert_array_equal(ds.train_labels, labels)
    _check_normalized(ds, images / 255.0, images / 255.0)


def test_cifar_pickle_from_old_numpy_loads(tmp_path):
    # The published batches name numpy.core.multiarray (numpy < 2); they must load as well.
    rng = np.random.default_rng(8)
    _write_cifar10(tmp_path, rng)
    for path in tmp_path.iterdir():
        data = path.read_bytes()
        path.write_bytes(data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))
    assert b"numpy.core.multiarray" in (tmp_path / "test_batch").read_bytes()
    assert load_cifar10(tmp_path).train_images.shape == (15, 32, 32, 3)


def test_cifar_corrupt_truncated_missing_and_hostile(tmp_path):
    rng = np.random.default_rng(2)
    root = tmp_path / "c10"
    _write_cifar10(root, rng)
    good = (root / "data_batch_2").read_bytes()

    (root / "data_batch_2").write_bytes(good[: len(good) // 2])
    with pytest.raises(DataError, match="data_batch_2.*not a readable CIFAR"):
        load_cifar10(root)

    (root / "data_batch_2").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(DataError, match="data_batch_2"):
        load_cifar10(root)

    # A pickle that would call os.system when loaded is refused, not run.
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    _dump(root / "data_batch_2", {b"data": Evil(), b"labels": []})
    with pytest.raises(DataError, match="refusing to load"):
        load_cifar10(root)

    _dump(root / "data_batch_2", {b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]})
    with pytest.raises(DataError, match=r"expected uint8 of shape \(N, 3072\)"):
        load_cifar10(root)

    _dump(root / "data_batch_2", {b"pixels": np.zeros((2, 3072), np.uint8)})
    with pytest.raises(DataError, match="no 'data' entry"):
        load_cifar10(root)

    (root / "data_batch_2").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_2"):
        load_cifar10(root)


def test_cifar_labels_checked_before_the_int32_cast(tmp_path):
    # 2**32 + 3 is class 3 after an int32 cast: the range check must see the stored value.
    root = tmp_path / "c10"
    _write_cifar10(root, np.random.default_rng(9))
    big = np.array([2**32 + 3, 1, 2], np.int64)
    _dump(root / "data_batch_3", {b"data": np.zeros((3, 3072), np.uint8), b"labels": big})
    with pytest.raises(
        DataError,
        match=r"cifar10 train labels must lie in \[0, 10\), got range "
        r"\[0, 4294967299\]",
    ):
        load_cifar10(root)
    _dump(root / "data_batch_3", {b"data": np.zeros((1, 3072), np.uint8), b"labels": [-(2**32)]})
    with pytest.raises(DataError, match=r"got range \[-4294967296, 9\]"):
        load_cifar10(root)


def test_make_dataset_checks_label_range_and_dtype_before_casting():
    images = np.zeros((2, 4, 4, 1), np.uint8)
    ok = np.array([0, 1], np.int64)
    with pytest.raises(DataError, match=r"t test labels must lie in \[0, 2\).*4294967297"):
        make_dataset("t", (images, ok), (images, ok + 2**32), num_classes=2, scale=255.0)
    with pytest.raises(DataError, match="t train labels have dtype float64, expected integer"):
        make_dataset("t", (images, np.array([0.0, 1.5])), (images, ok), num_classes=2, scale=1.0)
    ds = make_dataset("t", (images, ok.astype(np.uint64)), (images, ok), num_classes=2, scale=1.0)
    assert ds.train_labels.dtype == np.int32 and ds.train_labels.tolist() == [0, 1]


# ---------------------------------------------------------------- IDX


def _idx_bytes(array, magic):
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def _write_mnist(root, rng, *, gz, n_train=6, n_test=3):
    root.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n).astype(np.uint8)
        for kind, arr, magic, dims in (
            ("images", images, 0x803, 3),
            ("labels", labels, 0x801, 1),
        ):
            data = _idx_bytes(arr, magic)
            name = f"{prefix}-{kind}-idx{dims}-ubyte"
            if gz:
                (root / (name + ".gz")).write_bytes(gzip.compress(data))
            else:
                (root / name).write_bytes(data)
        arrays[prefix] = (images, labels)
    return arrays


@pytest.mark.parametrize("gz", [True, False], ids=["gzip", "raw"])
def test_mnist_idx(tmp_path, gz):
    arrays = _write_mnist(tmp_path, np.random.default_rng(3), gz=gz)
    ds = get_dataset(f"mnist:{tmp_path}")
    assert ds.image_shape == (28, 28, 1) and ds.name == "mnist"
    np.testing.assert_array_equal(ds.train_labels, arrays["train"][1])
    np.testing.assert_array_equal(ds.test_labels, arrays["t10k"][1])
    _check_normalized(
        ds, arrays["train"][0][..., None] / 255.0, arrays["t10k"][0][..., None] / 255.0
    )
    fashion = load_fashion_mnist(tmp_path)
    assert fashion.class_names[9] == "Ankle boot"


def test_idx_errors(tmp_path):
    _write_mnist(tmp_path, np.random.default_rng(4), gz=False)
    images = tmp_path / "train-images-idx3-ubyte"
    labels = tmp_path / "train-labels-idx1-ubyte"
    good = images.read_bytes()
    assert read_idx(images).shape == (6, 28, 28)

    images.write_bytes(good[:-10])  # truncated payload
    with pytest.raises(DataError, match="truncated"):
        load_mnist(tmp_path)

    images.write_bytes(labels.read_bytes())  # labels file under the images name
    with pytest.raises(DataError, match="magic number 0x00000801, expected 0x00000803"):
        load_mnist(tmp_path)

    images.unlink()
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(good)[:-20])
    with pytest.raises(DataError, match="corrupt or truncated gzip"):
        load_mnist(tmp_path)

    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"\x00\x00")
    with pytest.raises(DataError, match="too short"):
        load_mnist(tmp_path)

    (tmp_path / "train-images-idx3-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
        load_mnist(tmp_path)


@pytest.mark.parametrize("dim", [2**21, 2**32 - 1])
def test_idx_size_message_does_not_overflow(tmp_path, dim):
    # dim**3 bytes overflows int64 (2**63, 2**96): the message gives the exact Python count.
    path = tmp_path / "huge-idx3-ubyte"
    path.write_bytes((0x803).to_bytes(4, "big") + dim.to_bytes(4, "big") * 3 + b"\0" * 10)
    with pytest.raises(DataError, match=rf"holds 10 bytes of data, expected {dim**3} for shape"):
        read_idx(path)


# ---------------------------------------------------------------- image folder


def _save(path, pixels, fmt="PNG"):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, format=fmt)


def test_folder_presplit_png(tmp_path):
    rng = np.random.default_rng(5)
    raw = {}
    for split, n in (("train", 3), ("test", 2)):
        for cls in ("cat", "dog"):
            for i in range(n):
                px = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
                _save(tmp_path / split / cls / f"{i}.png", px)
                raw.setdefault(split, []).append(px)
    (tmp_path / "train" / "cat" / "notes.txt").write_text("not an image")
    ds = get_dataset(f"folder:{tmp_path}")
    assert ds.class_names == ("cat", "dog") and ds.image_shape == (5, 7, 3)
    np.testing.assert_array_equal(ds.train_labels, [0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(ds.test_labels, [0, 0, 1, 1])
    # PNG is lossless, so pixels come back exactly.
    _check_normalized(ds, np.stack(raw["train"]) / 255.0, np.stack(raw["test"]) / 255.0)


@pytest.mark.parametrize("have, missing", [("train", "test"), ("test", "train")])
def test_folder_with_half_a_split_names_the_missing_one(tmp_path, have, missing):
    for cls in ("cat", "dog"):
        _save(tmp_path / have / cls / "0.png", np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(
        DataError, match=rf"has {have}/ but no {missing}/; add .*{missing}/<class>/"
    ):
        load_folder(tmp_path)


def test_folder_single_split_grayscale_jpeg_resize(tmp_path):
    rng = np.random.default_rng(6)
    for cls in ("a", "b", "c"):
        for i in range(4):
            size = (6, 6) if i % 2 else (9, 7)
            _save(tmp_path / cls / f"{i}.jpg", rng.integers(0, 256, size, dtype=np.uint8), "JPEG")
    with pytest.raises(DataError, match="all images must have one size"):
        load_folder(tmp_path)
    ds = load_folder(tmp_path, seed=1, test_fraction=0.25, image_size=(4, 5))
    assert ds.image_shape == (4, 5, 1) and ds.num_classes == 3
    assert ds.train_images.shape[0] == 9 and ds.test_images.shape[0] == 3
    again = load_folder(tmp_path, seed=1, test_fraction=0.25, image_size=(4, 5))
    np.testing.assert_array_equal(again.test_images, ds.test_images)


def test_folder_bad_images_and_layouts(tmp_path):
    rng = np.random.default_rng(7)
    for i in range(3):
        _save(tmp_path / "x" / f"{i}.png", rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
    bad = tmp_path / "x" / "1.png"
    good = bad.read_bytes()

    bad.write_bytes(b"this is not a png")
    with pytest.raises(DataError, match=r"Cannot read image .*1\.png"):
        load_folder(tmp_path)

    bad.write_bytes(good[: len(good) // 2])  # header intact, pixel data cut off
    with pytest.raises(DataError, match=r"1\.png"):
        load_folder(tmp_path)

    bad.unlink()
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds no images"):
        load_folder(tmp_path)

    with pytest.raises(DataError, match="no class sub-directories"):
        load_folder(tmp_path / "x")
