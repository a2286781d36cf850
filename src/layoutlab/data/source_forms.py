"""The forms of a data source (the text that names a data set) and the image shapes they
fix, for help texts and compile options that must not load the loaders."""

__all__ = ["SOURCE_FORMS", "SYNTHETIC_SHAPE", "known_image_shape", "parse_image_shape"]


SOURCE_FORMS = (
    "digits",
    "cifar10:DIR",
    "cifar100:DIR",
    "mnist:DIR",
    "fashion_mnist:DIR",
    "folder:DIR",
    "synthetic[:HxWxC[:CLASSES[:N]]]  (e.g. synthetic:32x32x3:10:1280)",
)


def parse_image_shape(text: str, *, rank: int = 3) -> tuple[int, ...]:
    """``"32x32x3"`` -> ``(32, 32, 3)``; ``rank`` is the number of sizes expected."""
    parts = text.lower().split("x")
    if len(parts) != rank or not all(p.isdigit() and int(p) > 0 for p in parts):
        want = {2: "HxW", 3: "HxWxC"}.get(rank, "x".join(["N"] * rank))
        raise ValueError(f"Expected a shape like {want} with positive sizes, got {text!r}.")
    return tuple(int(p) for p in parts)


# The image shape of "synthetic" without HxWxC.
SYNTHETIC_SHAPE = (32, 32, 3)
# Image shapes (H, W, C) of the sources whose every image has the same, known shape.
_FIXED_SHAPES = {
    "digits": (8, 8, 1),
    "cifar10": (32, 32, 3),
    "cifar100": (32, 32, 3),
    "mnist": (28, 28, 1),
    "fashion_mnist": (28, 28, 1),
}


def known_image_shape(source: str, /) -> tuple[int, int, int] | None:
    """The ``(H, W, C)`` of every image of data source ``source``, read from the text alone
    (nothing is loaded); None where only loading tells (a folder) or the source is bad."""
    name, sep, rest = source.strip().partition(":")
    name = name.lower().replace("-", "_")
    if name == "synthetic":
        first = rest.split(":")[0] if sep else ""
        try:
            return parse_image_shape(first) if first else SYNTHETIC_SHAPE
        except ValueError:
            return None
    return _FIXED_SHAPES.get(name)
