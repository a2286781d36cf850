"""``layoutlab train``'s augmentation and regularization flags (``train.batch_augment``),
each setting the ``TrainConfig`` field of its name. Imports no JAX (``train --help``)."""

from __future__ import annotations

import argparse

from layoutlab.data.augment_policy import ERASING_MODES

__all__ = ["AUGMENT_FLAGS", "add_augment_flags"]

# flag dest -> TrainConfig field
AUGMENT_FLAGS = {
    "auto_augment": "auto_augment",
    "random_erasing": "random_erasing",
    "random_erasing_mode": "random_erasing_mode",
    "mixup": "mixup",
    "cutmix": "cutmix",
    "label_smoothing": "label_smoothing",
}


def add_augment_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "augmentation and regularization (training batches only, on device; timm's semantics)"
    )
    g.add_argument(
        "--auto-augment",
        metavar="POLICY",
        help="per image, after the crop and flip: trivial (TrivialAugment-Wide) or rand-mM-nN "
        "(RandAugment: N ops at magnitude M of 10, e.g. rand-m9-n2); default: none",
    )
    g.add_argument(
        "--random-erasing",
        metavar="P",
        help="probability that an image gets one random rectangle erased (timm's --reprob; "
        "default 0)",
    )
    g.add_argument(
        "--random-erasing-mode",
        choices=ERASING_MODES,
        help="what an erased rectangle holds: pixel (normal noise, default) or const (zeros: "
        "the data set's mean)",
    )
    g.add_argument(
        "--mixup",
        metavar="ALPHA",
        help="blend each batch with its reverse, lam ~ Beta(ALPHA, ALPHA) (default 0: off)",
    )
    g.add_argument(
        "--cutmix",
        metavar="ALPHA",
        help="paste a box of the reversed batch, lam ~ Beta(ALPHA, ALPHA) then the share left "
        "(default 0: off); with --mixup, one of the two per batch with probability 1/2",
    )
    g.add_argument(
        "--label-smoothing",
        metavar="EPS",
        help="smooth the training targets by EPS in [0, 1) (optax.smooth_labels; default 0)",
    )
