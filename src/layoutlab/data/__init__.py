"""Data sets, deterministic resumable batching, on-device augmentation and device prefetch.

``get_dataset(source)`` loads the data set a data source names (``SOURCE_FORMS``): digits
(built in), CIFAR-10/100, MNIST/Fashion-MNIST, an image folder or synthetic data, into a
``Dataset`` of normalized NHWC float32 host arrays;
``epoch_batches`` yields batches in any layout and dtype from any step of an epoch;
``augment`` crops and flips on device; ``prefetch_to_device`` overlaps input with compute.


Names load lazily (``layoutlab.lazy``), so importing the package, as the CLI does
to build its parser, imports no JAX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from layoutlab.lazy import lazy_exports

if TYPE_CHECKING:
    from layoutlab.data.augmentation import augment, random_crop, random_flip
    from layoutlab.data.cifar import load_cifar10, load_cifar100
    from layoutlab.data.dataset import Dataset, channel_stats, make_dataset, split_by_seed
    from layoutlab.data.digits import load_digits
    from layoutlab.data.errors import DataError
    from layoutlab.data.folder import load_folder
    from layoutlab.data.idx import load_fashion_mnist, load_mnist, read_idx
    from layoutlab.data.loader import epoch_batches, steps_per_epoch, train_batches
    from layoutlab.data.prefetch import Prefetcher, prefetch_to_device
    from layoutlab.data.source import get_dataset, parse_image_shape
    from layoutlab.data.source_forms import SOURCE_FORMS
    from layoutlab.data.synthetic import make_synthetic

_EXPORTS = {
    "augment": "augmentation",
    "random_crop": "augmentation",
    "random_flip": "augmentation",
    "load_cifar10": "cifar",
    "load_cifar100": "cifar",
    "Dataset": "dataset",
    "channel_stats": "dataset",
    "make_dataset": "dataset",
    "split_by_seed": "dataset",
    "load_digits": "digits",
    "DataError": "errors",
    "load_folder": "folder",
    "load_fashion_mnist": "idx",
    "load_mnist": "idx",
    "read_idx": "idx",
    "epoch_batches": "loader",
    "steps_per_epoch": "loader",
    "train_batches": "loader",
    "Prefetcher": "prefetch",
    "prefetch_to_device": "prefetch",
    "SOURCE_FORMS": "source_forms",
    "get_dataset": "source",
    "parse_image_shape": "source",
    "make_synthetic": "synthetic",
}

__all__ = [
    "SOURCE_FORMS",
    "DataError",
    "Dataset",
    "Prefetcher",
    "augment",
    "channel_stats",
    "epoch_batches",
    "get_dataset",
    "load_cifar10",
    "load_cifar100",
    "load_digits",
    "load_fashion_mnist",
    "load_folder",
    "load_mnist",
    "make_dataset",
    "make_synthetic",
    "parse_image_shape",
    "prefetch_to_device",
    "random_crop",
    "random_flip",
    "read_idx",
    "split_by_seed",
    "steps_per_epoch",
    "train_batches",
]

# Old names (a data source was called a spec), kept with a DeprecationWarning.
_RENAMED = {"SPEC_FORMS": "layoutlab.data.SOURCE_FORMS"}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, lambda: set(globals()), _RENAMED)
