"""The forms of a data set spec, for help texts that must not load the loaders."""

SPEC_FORMS = (
    "digits",
    "cifar10:DIR",
    "cifar100:DIR",
    "mnist:DIR",
    "fashion_mnist:DIR",
    "folder:DIR",
    "synthetic[:HxWxC[:CLASSES[:N]]]  (e.g. synthetic:32x32x3:10:1280)",
)
