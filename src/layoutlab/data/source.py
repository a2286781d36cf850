"""``get_dataset(source)``: one string, a data source, names any data set the package can
load."""

from __future__ import annotations

from layoutlab.data.cifar import load_cifar10, load_cifar100
from layoutlab.data.dataset import Dataset
from layoutlab.data.digits import load_digits
from layoutlab.data.folder import load_folder
from layoutlab.data.idx import load_fashion_mnist, load_mnist
from layoutlab.data.source_forms import (
    SOURCE_FORMS,
    SYNTHETIC_SHAPE,
    known_image_shape,
    parse_image_shape,
)
from layoutlab.data.synthetic import make_synthetic

__all__ = ["get_dataset", "known_image_shape", "SOURCE_FORMS", "parse_image_shape"]


_DIR_LOADERS = {
    "cifar10": load_cifar10,
    "cifar100": load_cifar100,
    "mnist": load_mnist,
    "fashion_mnist": load_fashion_mnist,
}


def _bad_source(source: str, why: str) -> ValueError:
    # One line: the CLI prints it as its one `error:` line.
    forms = ", ".join(SOURCE_FORMS)
    return ValueError(f"Bad data source {source!r}: {why}; valid forms are: {forms}.")


def _synthetic(source: str, args: list[str], seed: int, test_fraction: float) -> Dataset:
    if len(args) > 3:
        raise _bad_source(source, "synthetic takes at most HxWxC, CLASSES and N")
    try:
        shape = parse_image_shape(args[0]) if args and args[0] else SYNTHETIC_SHAPE
        ints = [int(a) for a in args[1:]]
    except ValueError as e:
        raise _bad_source(source, str(e)) from e
    classes = ints[0] if ints else 10
    n = ints[1] if len(ints) > 1 else 1280
    return make_synthetic(shape, classes, n, seed=seed, test_fraction=test_fraction)


def get_dataset(
    source: str,
    /,
    *,
    seed: int = 0,
    test_fraction: float = 0.2,
    image_size: tuple[int, int] | None = None,
) -> Dataset:
    """Load the data set named by the data source ``source`` (see ``SOURCE_FORMS``).

    ``seed`` and ``test_fraction`` drive the train/test split of sources that ship no test
    split (digits, a single-split folder, synthetic); ``image_size=(H, W)`` resizes folder images.
    """
    name, sep, rest = source.strip().partition(":")
    name = name.lower().replace("-", "_")
    if name == "digits":
        if sep:
            raise _bad_source(source, "digits takes no argument")
        return load_digits(seed=seed, test_fraction=test_fraction)
    if name == "synthetic":
        return _synthetic(source, rest.split(":") if sep else [], seed, test_fraction)
    if name in _DIR_LOADERS or name == "folder":
        if not rest:
            raise _bad_source(source, f"{name} needs a directory, as in {name}:DIR")
        if name == "folder":
            return load_folder(rest, seed=seed, test_fraction=test_fraction, image_size=image_size)
        return _DIR_LOADERS[name](rest)
    raise _bad_source(source, f"unknown data set {name!r}")
