"""Data sets, deterministic resumable batching, on-device augmentation and device prefetch.

``get_dataset(spec)`` loads digits (built in), CIFAR-10/100, MNIST/Fashion-MNIST, an image
folder or synthetic data into a ``Dataset`` of normalized NHWC float32 host arrays;
``epoch_batches`` yields batches in any layout and dtype from any step of an epoch;
``augment`` crops and flips on device; ``prefetch_to_device`` overlaps input with compute.
"""

from layoutlab.data.augment import augment, random_crop, random_flip
from layoutlab.data.cifar import load_cifar10, load_cifar100
from layoutlab.data.dataset import SPLITS, Dataset, channel_stats, make_dataset, split_by_seed
from layoutlab.data.digits import load_digits
from layoutlab.data.errors import DataError
from layoutlab.data.folder import load_folder
from layoutlab.data.idx import load_fashion_mnist, load_mnist, read_idx
from layoutlab.data.loader import epoch_batches, epoch_order, steps_per_epoch, train_batches
from layoutlab.data.prefetch import Prefetcher, prefetch_to_device
from layoutlab.data.spec import SPEC_FORMS, get_dataset, parse_image_shape
from layoutlab.data.synthetic import make_synthetic

__all__ = [
    "SPEC_FORMS",
    "SPLITS",
    "DataError",
    "Dataset",
    "Prefetcher",
    "augment",
    "channel_stats",
    "epoch_batches",
    "epoch_order",
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
