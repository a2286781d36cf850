"""What a run's train step does to a batch before the forward pass, built from its config.

In timm's order: the crop and flip (``augment``), the auto-augmentation (``auto_augment``),
random erasing (``random_erasing``), per image; then mixup or cutmix of the batch and label
smoothing of its targets (``optax.smooth_labels``). Every key comes from the seed and the
global step (``train.steps.make_train_step`` folds the step in), so a resumed run draws what
an uninterrupted one would. Each stage folds its own constant into the run's key, so turning
one on changes no other's draws, and the crop and flip keep the key they always had.
The eval step never sees any of this.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import optax

from layoutlab.data.augment_policy import parse_auto_augment
from layoutlab.data.augmentation import augment as crop_and_flip
from layoutlab.data.auto_augment import auto_augment
from layoutlab.data.mixing import mix_batch
from layoutlab.data.random_erasing import random_erasing
from layoutlab.train.spec import InputSpec, RunSpec

__all__ = ["AUTO_AUGMENT_KEY", "ERASING_KEY", "MIXING_KEY", "image_augment", "soft_targets"]

# Constants folded into the run's key, one per stage.
AUTO_AUGMENT_KEY, ERASING_KEY, MIXING_KEY = 1, 2, 3


def image_augment(spec: RunSpec, inputs: InputSpec) -> Callable | None:
    """``(key, images) -> images`` of ``spec``'s per-image augmentations; None: there are
    none."""
    config, layout, seed = spec.config, spec.layout, spec.seed
    policy = None if config.auto_augment is None else parse_auto_augment(config.auto_augment)
    if not (spec.augment or policy is not None or config.random_erasing > 0):
        return None
    if policy is not None and inputs.pixel_stats is None:
        raise ValueError(
            "auto_augment works in pixel units, which needs the mean and std the images were "
            "normalized with (InputSpec.of(dataset)); these inputs have none."
        )
    mean, std = inputs.pixel_stats or ((), ())

    def fn(key, images):
        key = jax.random.fold_in(key, seed)
        if spec.augment:
            images = crop_and_flip(key, images, layout)
        if policy is not None:
            k = jax.random.fold_in(key, AUTO_AUGMENT_KEY)
            images = auto_augment(k, images, layout, policy, mean, std)
        if config.random_erasing > 0:
            k = jax.random.fold_in(key, ERASING_KEY)
            images = random_erasing(
                k, images, layout, config.random_erasing, config.random_erasing_mode
            )
        return images

    return fn


def soft_targets(spec: RunSpec, inputs: InputSpec) -> Callable | None:
    """``(key, images, labels) -> (images, targets, labels)`` of ``spec``'s mixup, cutmix and
    label smoothing: the mixed images, float32 targets (one row per image, summing to 1) and
    the labels the train accuracy counts (each image's dominant label); None: the run trains
    on its integer labels."""
    config, layout, seed = spec.config, spec.layout, spec.seed
    mixup, cutmix, smoothing = config.mixup, config.cutmix, config.label_smoothing
    if mixup == 0 and cutmix == 0 and smoothing == 0:
        return None
    classes = inputs.num_classes

    def fn(key, images, labels):
        key = jax.random.fold_in(jax.random.fold_in(key, seed), MIXING_KEY)
        images, targets, dominant, _ = mix_batch(
            key, images, labels, layout, classes, mixup_alpha=mixup, cutmix_alpha=cutmix
        )
        if smoothing > 0:
            targets = optax.smooth_labels(targets, smoothing)
        return images, targets, dominant

    return fn
