"""MNIST and Fashion-MNIST from IDX files in a local directory, gzipped or not.

Files: ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``,
``t10k-labels-idx1-ubyte``, each optionally ending in ``.gz`` (detected by content, not name).
The directory may also be the parent of a ``raw/`` folder, as torchvision leaves it.
"""

from __future__ import annotations

import dataclasses
import gzip
import math
import zlib
from pathlib import Path

import numpy as np

from layoutlab.data.dataset import Dataset, make_dataset
from layoutlab.data.errors import DataError
from layoutlab.data.fingerprint import files_fingerprint

__all__ = ["read_idx", "load_mnist", "load_fashion_mnist", "IMAGES_MAGIC", "LABELS_MAGIC"]

IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dims
LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dim
_GZIP_MAGIC = b"\x1f\x8b"
_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_FASHION_NAMES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)


def _read_bytes(path: Path) -> bytes:
    raw = path.read_bytes()
    if not raw.startswith(_GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{path} is a corrupt or truncated gzip file ({e}).") from e


def read_idx(path: str | Path, *, expected_magic: int | None = None) -> np.ndarray:
    """Read one IDX file (raw or gzipped) into a numpy array; errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"IDX file {path} not found.")
    data = _read_bytes(path)
    if len(data) < 4:
        raise DataError(f"{path} is {len(data)} bytes long, too short for an IDX header.")
    magic = int.from_bytes(data[:4], "big")
    if expected_magic is not None and magic != expected_magic:
        raise DataError(
            f"{path} has IDX magic number 0x{magic:08x}, expected 0x{expected_magic:08x}; "
            f"is it the right file (images vs labels) and in IDX format?"
        )
    zero, code, ndim = data[:2], data[2], data[3]
    if zero != b"\x00\x00" or code not in _IDX_DTYPES or ndim == 0:
        raise DataError(f"{path} does not start with a valid IDX magic number (0x{magic:08x}).")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{path} is truncated inside its IDX header ({len(data)} bytes).")
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = _IDX_DTYPES[code]
    # Python ints: the declared dims (up to 2**32 - 1 each) overflow numpy's int64 product.
    expected = math.prod(shape) * dtype.itemsize
    if len(data) - header != expected:
        raise DataError(
            f"{path} holds {len(data) - header} bytes of data, expected {expected} for shape "
            f"{shape} of {dtype.name}; the file is truncated or corrupt."
        )
    return np.frombuffer(data, dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def _find_file(root: Path, stem: str) -> Path:
    dotted = stem.replace("-idx", ".idx")  # some mirrors name files train-images.idx3-ubyte
    candidates = [
        folder / name
        for folder in (root, root / "raw")
        for base in (stem, dotted)
        for name in (base, base + ".gz")
    ]
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"No {stem}[.gz] in {root} (also looked in {root / 'raw'}); expected the four IDX "
        f"files train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
        f"t10k-labels-idx1-ubyte (gzipped or not)."
    )


def _split(root: Path, prefix: str, read: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    images_path = _find_file(root, f"{prefix}-images-idx3-ubyte")
    labels_path = _find_file(root, f"{prefix}-labels-idx1-ubyte")
    images = read_idx(images_path, expected_magic=IMAGES_MAGIC)
    labels = read_idx(labels_path, expected_magic=LABELS_MAGIC)
    read += [images_path, labels_path]
    if images.shape[0] != labels.shape[0]:
        raise DataError(
            f"{images_path} has {images.shape[0]} images but {labels_path} has "
            f"{labels.shape[0]} labels; the files do not belong together."
        )
    return images[..., None], labels  # make_dataset checks the range, then casts


def _load(directory: str | Path, name: str, class_names: tuple[str, ...]) -> Dataset:
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"Data directory {root} does not exist or is not a directory.")
    read: list[Path] = []
    train, test = _split(root, "train", read), _split(root, "t10k", read)
    dataset = make_dataset(name, train, test, num_classes=10, scale=255.0, class_names=class_names)
    return dataclasses.replace(dataset, fingerprint=files_fingerprint(root, read))


def load_mnist(directory: str | Path) -> Dataset:
    """MNIST (28x28x1, 10 classes) from the IDX files in ``directory``."""
    return _load(directory, "mnist", tuple(str(d) for d in range(10)))


def load_fashion_mnist(directory: str | Path) -> Dataset:
    """Fashion-MNIST (28x28x1, 10 classes) from the IDX files in ``directory``."""
    return _load(directory, "fashion_mnist", _FASHION_NAMES)
