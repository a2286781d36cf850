"""CIFAR-10 / CIFAR-100 from the "python version" pickle batches in a local directory.

CIFAR-10: ``data_batch_1`` .. ``data_batch_5``, ``test_batch``, ``batches.meta``.
CIFAR-100: ``train``, ``test``, ``meta`` (fine labels are used).
The directory may be the extracted archive's folder (``cifar-10-batches-py``) or its parent.

Pickles are read with an unpickler that only builds numpy arrays and plain containers, so a
hostile file cannot run code.
"""

from __future__ import annotations

import codecs
import dataclasses
import pickle
from pathlib import Path

import numpy as np

from layoutlab.data.dataset import Dataset, make_dataset
from layoutlab.data.errors import DataError
from layoutlab.data.fingerprint import files_fingerprint

__all__ = ["load_cifar10", "load_cifar100", "read_cifar_pickle"]

_CIFAR10_SUBDIR = "cifar-10-batches-py"
_CIFAR100_SUBDIR = "cifar-100-python"
_IMAGE_BYTES = 32 * 32 * 3

_ZERO = np.zeros(1)
# The numpy callables an array pickle refers to, found from the running numpy itself so that
# old files naming `numpy.core` and new ones naming `numpy._core` both resolve without the
# deprecated-module import.
_ALLOWED = {
    "_reconstruct": _ZERO.__reduce__()[0],
    "ndarray": np.ndarray,
    "dtype": np.dtype,
    "scalar": np.float64(0).__reduce__()[0],
}
_NUMPY_MODULES = ("numpy", "numpy.core.multiarray", "numpy._core.multiarray")


class _NumpyOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module in _NUMPY_MODULES and name in _ALLOWED:
            return _ALLOWED[name]
        if (module, name) == ("_codecs", "encode"):  # how protocol 2 writes bytes from Python 3
            return codecs.encode
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} (only numpy arrays)")


def _decode_keys(obj: dict) -> dict:
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}


def read_cifar_pickle(path: Path) -> dict:
    """Load one CIFAR pickle as a dict with ``str`` keys; errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"CIFAR file {path} not found.")
    try:
        with path.open("rb") as f:
            obj = _NumpyOnlyUnpickler(f, encoding="bytes").load()
    except Exception as e:  # pickle raises many types for corrupt input
        raise DataError(
            f"{path} is not a readable CIFAR python pickle ({type(e).__name__}: {e}); "
            f"expected the 'python version' batches from the CIFAR website."
        ) from e
    if not isinstance(obj, dict):
        raise DataError(f"{path} holds a {type(obj).__name__}, expected a dict of arrays.")
    return _decode_keys(obj)


def _batch_arrays(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    batch = read_cifar_pickle(path)
    for key in ("data", label_key):
        if key not in batch:
            raise DataError(
                f"{path} has no '{key}' entry (found: {', '.join(map(str, batch))}); "
                f"expected a CIFAR batch with 'data' and '{label_key}'."
            )
    data = np.asarray(batch["data"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != _IMAGE_BYTES:
        raise DataError(
            f"{path}: 'data' is {data.dtype} of shape {data.shape}, expected uint8 of shape "
            f"(N, {_IMAGE_BYTES}) (32x32x3 images, channel-major)."
        )
    labels = np.asarray(batch[label_key])
    if labels.shape != (data.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(
            f"{path}: '{label_key}' has shape {labels.shape} and dtype {labels.dtype}, "
            f"expected {data.shape[0]} integer labels."
        )
    # Rows are channel-major (1024 R, 1024 G, 1024 B), each channel row-major.
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    # Labels keep their dtype: make_dataset checks their range before casting to int32.
    return images, labels


def _find_root(directory: str | Path, subdir: str, marker: str) -> Path:
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"Data directory {root} does not exist or is not a directory.")
    if not (root / marker).exists() and (root / subdir / marker).exists():
        return root / subdir
    return root


def _names(path: Path, key: str, count: int) -> tuple[str, ...]:
    if not path.is_file():
        return tuple(str(i) for i in range(count))
    meta = read_cifar_pickle(path)
    names = meta.get(key)
    if names is None or len(names) != count:
        raise DataError(f"{path}: expected '{key}' with {count} class names.")
    return tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names)


def _with_fingerprint(dataset: Dataset, root: Path, paths: list[Path]) -> Dataset:
    """``dataset`` with the fingerprint of the files it was read from (the class-name file
    only where it exists: without it the names are numbers)."""
    read = [p for p in paths if p.is_file()]
    return dataclasses.replace(dataset, fingerprint=files_fingerprint(root, read))


def load_cifar10(directory: str | Path) -> Dataset:
    """CIFAR-10 from ``directory`` (50000 train, 10000 test images of 32x32x3)."""
    root = _find_root(directory, _CIFAR10_SUBDIR, "data_batch_1")
    parts = [_batch_arrays(root / f"data_batch_{i}", "labels") for i in range(1, 6)]
    train = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    test = _batch_arrays(root / "test_batch", "labels")
    names = _names(root / "batches.meta", "label_names", 10)
    dataset = make_dataset("cifar10", train, test, num_classes=10, scale=255.0, class_names=names)
    read = [root / f"data_batch_{i}" for i in range(1, 6)] + [root / "test_batch"]
    return _with_fingerprint(dataset, root, [*read, root / "batches.meta"])


def load_cifar100(directory: str | Path) -> Dataset:
    """CIFAR-100 from ``directory`` with its 100 fine labels."""
    root = _find_root(directory, _CIFAR100_SUBDIR, "train")
    train = _batch_arrays(root / "train", "fine_labels")
    test = _batch_arrays(root / "test", "fine_labels")
    names = _names(root / "meta", "fine_label_names", 100)
    dataset = make_dataset("cifar100", train, test, num_classes=100, scale=255.0, class_names=names)
    return _with_fingerprint(dataset, root, [root / "train", root / "test", root / "meta"])
