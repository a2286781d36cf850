"""Image-folder data sets read with Pillow.

Layouts: ``DIR/train/<class>/*`` plus ``DIR/test/<class>/*`` (used as given), or
``DIR/<class>/*`` (split into train/test by seed, stratified: ``test_fraction`` of every
class is test, ``data.validation.stratified_indices``). A directory is taken as pre-split exactly
when it has both ``train/`` and ``test/``. Classes are the sorted sub-directory names of the
train part; files ending in .png, .jpg, .jpeg, .bmp or .gif are images, other files are skipped.

Size rule: with ``image_size=(H, W)`` every image is resized (bilinear) to it; without it all
images must have the size of the first one, and a differing image is an error naming it.
Channels: if every image is grayscale the data set has 1 channel, otherwise all images are
converted to RGB (alpha dropped). Depth: 8-bit pixels are scaled by 255; if any image is
16-bit grayscale, every pixel is read in 16-bit units and scaled by 65535, never clipped
(``data.pixels``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from layoutlab.data.dataset import Dataset, make_dataset
from layoutlab.data.errors import DataError
from layoutlab.data.fingerprint import files_fingerprint
from layoutlab.data.memory import check_fits, peak_bytes
from layoutlab.data.pixels import DEEP_MAX, GRAY_MODES, SIXTEEN_BIT_MODES, check_mode, read_pixels
from layoutlab.data.validation import stratified_indices

__all__ = ["load_folder", "IMAGE_SUFFIXES"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
# How a single-split folder is split, in its fingerprint: before it was recorded, a seeded
# permutation of all images (a class could miss from test); now per class.
SPLIT = "stratified"


def _open(path: Path):
    from PIL import Image

    try:
        return Image.open(path)
    except Exception as e:  # Pillow raises several types for unreadable files
        raise DataError(f"Cannot read image {path} ({type(e).__name__}: {e}).") from e


def _header(path: Path) -> tuple[tuple[int, int], str]:
    """``((W, H), mode)`` from the file header, without decoding the pixels."""
    with _open(path) as image:
        check_mode(path, image.mode)
        return image.size, image.mode


def _class_files(split_dir: Path, classes: tuple[str, ...] | None) -> dict[str, list[Path]]:
    found = sorted(p for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not found:
        raise DataError(
            f"{split_dir} has no class sub-directories; expected {split_dir}/<class>/*.png "
            f"(or a pre-split DIR/train/<class>/ and DIR/test/<class>/)."
        )
    files = {}
    for class_dir in found:
        images = sorted(p for p in class_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not images:
            raise DataError(
                f"Class directory {class_dir} holds no images ({', '.join(IMAGE_SUFFIXES)}); "
                f"remove it or add images."
            )
        files[class_dir.name] = images
    if classes is not None:
        unknown = sorted(set(files) - set(classes))
        if unknown:
            raise DataError(
                f"{split_dir} has classes {unknown} that the train split lacks; train "
                f"classes are {list(classes)}."
            )
    return files


def _common_size(paths: list[Path], headers: list[tuple[tuple[int, int], str]]) -> tuple[int, int]:
    """``(H, W)`` shared by all images; an image of another size is an error naming it."""
    (first_w, first_h), _ = headers[0]
    for path, ((w, h), _) in zip(paths, headers, strict=True):
        if (w, h) != (first_w, first_h):
            raise DataError(
                f"{path} is {h}x{w} (HxW) but {paths[0]} is {first_h}x{first_w}; all images "
                "must have one size, or resize them with --image-size H,W "
                "(TrainConfig image_size=[H, W])."
            )
    return first_h, first_w


def _read_split(
    files: dict[str, list[Path]],
    classes: tuple[str, ...],
    gray: bool,
    size: tuple[int, int],
    deep: bool,
) -> tuple[np.ndarray, np.ndarray]:
    images, labels = [], []
    for name, paths in files.items():
        images += [read_pixels(p, gray, size, deep) for p in paths]
        labels += [classes.index(name)] * len(paths)
    return np.stack(images), np.asarray(labels, np.int32)


def _check_size(image_size) -> tuple[int, int] | None:
    if image_size is None:
        return None
    size = tuple(int(s) for s in image_size)
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"image_size must be (H, W) with positive sizes, got {image_size}.")
    return size


def load_folder(
    directory: str | Path,
    *,
    seed: int = 0,
    test_fraction: float = 0.2,
    image_size: tuple[int, int] | None = None,
) -> Dataset:
    """An image-folder data set (see the module docstring for the layout and size rules)."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"Image folder {root} does not exist or is not a directory.")
    size = _check_size(image_size)
    pre_split = (root / "train").is_dir() and (root / "test").is_dir()
    # Half a pre-split layout would otherwise be read as a class named "train" or "test".
    for have, missing in (("train", "test"), ("test", "train")):
        if (root / have).is_dir() and not (root / missing).exists():
            raise DataError(
                f"{root} has {have}/ but no {missing}/; add {root / missing}/<class>/ with the "
                f"same classes, or put the class folders directly under {root} to split by seed."
            )
    train_files = _class_files(root / "train" if pre_split else root, None)
    classes = tuple(train_files)
    test_files = _class_files(root / "test", classes) if pre_split else {}
    all_paths = [p for group in (train_files, test_files) for ps in group.values() for p in ps]
    headers = [_header(p) for p in all_paths]
    size = size or _common_size(all_paths, headers)
    gray = all(mode in GRAY_MODES for _, mode in headers)
    deep = any(mode in SIXTEEN_BIT_MODES for _, mode in headers)
    shape = (*size, 1 if gray else 3)
    check_fits(
        f"folder:{root}",
        f"{len(all_paths)} images of {'x'.join(map(str, shape))}",
        peak_bytes(len(all_paths), shape),
        "choose a smaller --image-size (TrainConfig image_size)"
        if image_size is not None
        else "use fewer or smaller images (resize them with --image-size H,W)",
    )
    train = _read_split(train_files, classes, gray, size, deep)
    if pre_split:
        test = _read_split(test_files, classes, gray, size, deep)
    else:
        kept, held = stratified_indices(
            train[1], test_fraction, seed=seed, what="test_fraction", names=classes
        )
        train, test = (train[0][kept], train[1][kept]), (train[0][held], train[1][held])
    dataset = make_dataset(
        f"folder:{root.name}",
        train,
        test,
        num_classes=len(classes),
        scale=DEEP_MAX if deep else 255.0,
        class_names=classes,
    )
    fingerprint = files_fingerprint(root, all_paths)
    if not pre_split:  # a run of the random split of earlier versions is told apart on resume
        fingerprint["split"] = SPLIT
    return dataclasses.replace(dataset, fingerprint=fingerprint, pixel_bits=16 if deep else 8)
