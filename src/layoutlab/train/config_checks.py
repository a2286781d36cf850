"""The checks of ``train.config.validate``, field by field: counts, float32 hyper-parameters,
names and conv settings, each taking a ``TrainConfig`` (not imported here: ``train.config``
imports this module). Each raises ``ValueError`` naming the field and the fix.

This module imports no JAX at import time (``train --help`` imports the config); the checks
that need JAX, the data set forms or the conv algorithms import them when they run.
"""

from __future__ import annotations

import dataclasses
import math
import struct

__all__ = [
    "AUTO_LOSS_SCALE",
    "AUTO_STORAGE",
    "INT32_MAX",
    "LAYER_IMPLS",
    "OPTIMIZERS",
    "SCHEDULES",
    "check_augment",
    "check_conv",
    "check_init",
    "check_int32",
    "check_names",
    "check_numbers",
    "check_positive",
    "check_recipes",
    "check_validation",
]

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
SCHEDULES = ("constant", "cosine", "step")
AUTO_LOSS_SCALE = "auto"  # as train.run_precision (imported lazily: no JAX for --help)
INT32_MAX = 2**31 - 1
AUTO_STORAGE = "auto"  # kernel/activation storage: resolved per backend (fast_defaults)
# TrainConfig.layer_impl: nn.norm.BATCH_NORM_IMPLS and nn.pooling.MAX_POOL_IMPLS, which are
# one set of names (not imported here: they import JAX, and `train --help` reads this).
LAYER_IMPLS = ("auto", "xla")


def check_positive(config, *names: str, allow_none: bool = False) -> None:
    for name in names:
        value = getattr(config, name)
        if value is None and allow_none:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        check_int32(name, value)


def check_int32(name: str, value: int) -> None:
    # Steps, batches and their counters are int32 on the device (the train state's step,
    # optax's count, the schedule's arguments): a larger value overflows inside JAX.
    if value > INT32_MAX:
        raise ValueError(
            f"{name}={value} is more than {INT32_MAX} (2**31 - 1), the largest count a run "
            f"keeps (its step counters are int32); use a smaller {name}."
        )


# float32's largest finite value and smallest normal one: hyper-parameters train as float32,
# where a larger value is inf, and a smaller nonzero one is subnormal (flushed to 0 by XLA).
_F32_MAX = 3.4028234663852886e38
_F32_TINY = 1.1754943508222875e-38


def _float32(value: float) -> float:
    """``value`` rounded to float32 (``struct`` does it without importing NumPy)."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def _check_float(
    config,
    name: str,
    low: float,
    high: float | None = None,
    *,
    low_open: bool = False,
    example: float | None = None,
) -> None:
    """``getattr(config, name)`` must be finite and in ``[low, high)`` (``(low, ...`` when
    ``low_open``) as the float32 it trains as; NaN and infinities fail every comparison that
    lets a value through. ``example``: the value the message suggests (default: the
    field's default)."""
    value = getattr(config, name)
    default = getattr(type(config)(), name) if example is None else example
    as_f32 = _float32(value) if math.isfinite(value) else value
    if math.isfinite(value) and (not math.isfinite(as_f32) or 0 < abs(value) < _F32_TINY):
        what = "overflows float32" if abs(value) > 1 else "underflows float32 (XLA flushes it to 0)"
        zero = "0 or " if low == 0 and not low_open else ""
        raise ValueError(
            f"{name}={value!r} {what}, which the run trains in; use {zero}a value "
            f"between {_F32_TINY:.3g} and {_F32_MAX:.3g}, e.g. {name}={default:g}."
        )
    ok = math.isfinite(as_f32) and (as_f32 > low if low_open else as_f32 >= low)
    ok = ok and (high is None or as_f32 < high)
    if not ok:
        where = f"{'>' if low_open else '>='} {low:g}"
        where += "" if high is None else f" and < {high:g}"
        where += " in float32" if math.isfinite(value) and as_f32 != value else ""
        raise ValueError(
            f"{name} must be a finite number {where}, got {value!r}; e.g. {name}={default:g}."
        )


def check_numbers(config) -> None:
    check_positive(config, "epochs", "batch_size", "accum_steps", "keep_checkpoints")
    check_positive(
        config, "num_steps", "eval_batch_size", "eval_every", "checkpoint_every", allow_none=True
    )
    if not isinstance(config.log_every, int) or config.log_every < 0:
        raise ValueError(
            f"log_every must be an integer >= 0 (0: no per-step log), got {config.log_every!r}."
        )
    check_int32("log_every", config.log_every)
    if config.warmup_steps is not None:
        if config.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0 or None, got {config.warmup_steps}.")
        check_int32("warmup_steps", config.warmup_steps)
    _check_float(config, "learning_rate", 0.0, low_open=True)
    _check_float(config, "weight_decay", 0.0)
    _check_float(config, "momentum", 0.0, 1.0)
    if not 0 <= config.seed < 2**31:
        raise ValueError(f"seed must lie in [0, 2**31), got {config.seed}.")


def check_names(config):
    """Checks the names; returns the ``Policy`` of ``config.precision`` (read here once)."""
    from layoutlab.data import SOURCE_FORMS
    from layoutlab.layout import Layout, parse_layout
    from layoutlab.precision import get_policy
    from layoutlab.train.run_precision import resolve_loss_scale

    if config.optimizer not in OPTIMIZERS:
        raise ValueError(
            f"Unknown optimizer {config.optimizer!r}; use one of: {', '.join(OPTIMIZERS)}."
        )
    if config.param_sharding not in ("replicated", "fsdp"):
        raise ValueError(
            f"param_sharding must be 'replicated' or 'fsdp', got {config.param_sharding!r}."
        )
    if config.layer_impl not in LAYER_IMPLS:
        raise ValueError(
            f"layer_impl must be one of {', '.join(LAYER_IMPLS)} (auto: oneDNN's batch norm "
            f"and max pool where they apply; xla: XLA's ops), got {config.layer_impl!r}."
        )
    if config.schedule not in SCHEDULES:
        raise ValueError(
            f"Unknown schedule {config.schedule!r}; use one of: {', '.join(SCHEDULES)}."
        )
    try:
        layout = parse_layout(config.layout)
    except ValueError as e:
        raise ValueError(f"layout: {e}") from None
    if layout not in (Layout.NHWC, Layout.NCHW):
        raise ValueError(f"layout must be NHWC or NCHW for image training, got {config.layout!r}.")
    try:
        policy = get_policy(config.precision)
    except ValueError as e:
        raise ValueError(f"precision: {e}") from None
    if config.loss_scale != AUTO_LOSS_SCALE:
        try:
            resolve_loss_scale(config.loss_scale, policy)
        except ValueError as e:
            raise ValueError(f"loss_scale: {str(e).rstrip('.')}, or 'auto'.") from None
    name = config.data.strip().partition(":")[0].lower().replace("-", "_")
    if name not in {form.split(":")[0].split("[")[0] for form in SOURCE_FORMS}:
        forms = ", ".join(SOURCE_FORMS)
        raise ValueError(f"Unknown data source {config.data!r}; valid forms are: {forms}.")
    if config.image_size is not None and name != "folder":
        raise ValueError(
            f"image_size resizes folder data only; {config.data!r} has a fixed image size: "
            "drop image_size, or use folder:DIR."
        )
    return policy


def check_conv(config, policy) -> None:
    from layoutlab.nn.conv_algos import unsupported_reason
    from layoutlab.nn.conv_config import check_conv_options

    storage = None if config.kernel_storage == AUTO_STORAGE else config.kernel_storage
    act = None if config.activation_storage == AUTO_STORAGE else config.activation_storage
    try:
        check_conv_options(config.conv_algorithm, storage, act)
    except ValueError as e:
        raise ValueError(f"conv settings: {e}") from None
    # An explicit algorithm whose error exceeds the compute dtype's bar would silently run
    # XLA's conv instead; say so before anything compiles ("auto" never picks one).
    compute = policy.compute_dtype
    if (reason := unsupported_reason(config.conv_algorithm, compute)) is not None:
        raise ValueError(
            f"conv_algorithm={config.conv_algorithm!r} with precision {config.precision!r} "
            f"(compute {compute.name}): {reason}; choose --conv-algo auto or another algorithm."
        )
    for name, value in config.xla_options.items():
        if not isinstance(name, str) or not isinstance(value, (bool, int, float, str)):
            raise ValueError(
                f"xla_options must map XLA option names (str) to bool, int, float or str "
                f"values, got {name!r}: {value!r}; e.g. "
                '{"xla_cpu_enable_fast_math": false} (--xla-option NAME=VALUE).'
            )


def check_recipes(config) -> None:
    """The schedule, clipping and EMA fields (issue 69) that need no data set; those that
    need the run's length are ``train.lr_schedule.check_run_steps``'s."""
    if config.warmup_epochs is not None:
        if config.warmup_steps is not None:
            raise ValueError(
                f"warmup_steps={config.warmup_steps} and warmup_epochs={config.warmup_epochs} "
                "both set the warmup; give one of them."
            )
        _check_float(config, "warmup_epochs", 0.0, example=1.0)
    _check_float(config, "min_lr", 0.0)
    if config.min_lr > config.learning_rate:
        raise ValueError(
            f"min_lr={config.min_lr:g} is above learning_rate={config.learning_rate:g}; a "
            "floor must lie below the peak: lower min_lr or raise the learning rate."
        )
    _check_float(config, "lr_decay_rate", 0.0, low_open=True)
    if config.lr_decay_rate > 1:
        raise ValueError(
            f"lr_decay_rate must be in (0, 1] (the factor of each decay), got "
            f"{config.lr_decay_rate!r}; e.g. lr_decay_rate=0.1."
        )
    _check_decay_epochs(config)
    if config.clip_grad_norm is not None:
        _check_float(config, "clip_grad_norm", 0.0, low_open=True, example=1.0)
    if config.ema_decay is not None:
        _check_float(config, "ema_decay", 0.0, 1.0, example=0.9998)


def _check_decay_epochs(config) -> None:
    epochs = config.lr_decay_epochs
    if config.schedule != "step":
        if epochs:
            raise ValueError(
                f"lr_decay_epochs={epochs} applies to schedule='step' only, the schedule is "
                f"{config.schedule!r}; add --schedule step or drop --lr-decay-epochs."
            )
        return
    if not epochs:
        raise ValueError(
            "schedule='step' needs the epochs to decay at: --lr-decay-epochs E1,E2,... "
            "(e.g. 30,60 for 90 epochs)."
        )
    numbers = all(isinstance(e, int | float) and not isinstance(e, bool) for e in epochs)
    if not numbers or not all(math.isfinite(e) and e > 0 for e in epochs):
        raise ValueError(
            f"lr_decay_epochs must be positive finite numbers of epochs, got {epochs!r}; "
            "e.g. --lr-decay-epochs 30,60."
        )
    if any(b <= a for a, b in zip(epochs, epochs[1:], strict=False)):
        raise ValueError(
            f"lr_decay_epochs must be strictly increasing, got {epochs!r}; e.g. 30,60."
        )


def check_init(config) -> None:
    """``init`` names something to read; ``freeze_backbone`` needs it (a frozen random
    backbone probes nothing)."""
    if config.init is not None and not config.init.strip():
        raise ValueError("init is empty; pass a .pth/.pt state dict or a run's workdir.")
    if config.freeze_backbone and config.init is None:
        raise ValueError(
            "freeze_backbone needs init: a frozen backbone would keep its random "
            "initialization; pass --init PATH (the weights to probe), or drop "
            "--freeze-backbone."
        )


def check_validation(config) -> None:
    """``val_fraction``, ``keep_best`` and ``early_stop`` (``train.best``)."""
    from layoutlab.train.best import parse_metric

    fraction = config.val_fraction
    if not (fraction == 0 or 0 < fraction < 1):  # NaN fails both
        raise ValueError(
            f"val_fraction must lie in (0, 1) (the share of each class held out for "
            f"validation), or be 0 for none; got {fraction!r}."
        )
    if config.keep_best is not None:
        parse_metric(config.keep_best, validation=fraction > 0)
    if config.early_stop is not None:
        check_positive(config, "early_stop")
        if config.keep_best is None:
            raise ValueError(
                "early_stop watches the keep_best metric, and this run keeps none; add "
                "--keep-best METRIC (e.g. val_accuracy with --val-fraction, or test_accuracy)."
            )


def check_augment(config):
    """The augmentation and regularization fields (``train.batch_augment``): rates in range,
    known names, and none on a model whose labels or inputs they do not fit. Returns the
    config with ``auto_augment`` in its one spelling (``rand`` is ``rand-m10-n2``), so a
    resume compares policies, not spellings."""
    from layoutlab.data.augment_policy import ERASING_MODES, parse_auto_augment

    if config.auto_augment is not None:
        policy = parse_auto_augment(config.auto_augment)  # ValueError naming the forms
        config = dataclasses.replace(config, auto_augment=policy.text)
    if not (math.isfinite(config.random_erasing) and 0 <= config.random_erasing <= 1):
        raise ValueError(
            f"random_erasing is a probability in [0, 1], got {config.random_erasing!r}; "
            "e.g. random_erasing=0.25."
        )
    if config.random_erasing_mode not in ERASING_MODES:
        raise ValueError(
            f"Unknown random_erasing_mode {config.random_erasing_mode!r}; use one of: "
            f"{', '.join(ERASING_MODES)}."
        )
    for name in ("mixup", "cutmix"):
        value = getattr(config, name)
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(
                f"{name} is the alpha of Beta(alpha, alpha), a finite number >= 0 (0: off), "
                f"got {value!r}; e.g. {name}=0.2."
            )
        _check_float(config, name, 0.0)  # as the float32 it is drawn with
    eps = config.label_smoothing
    if not (math.isfinite(eps) and 0 <= eps < 1):
        raise ValueError(
            f"label_smoothing must be in [0, 1) (1 would leave no trace of the label), got "
            f"{eps!r}; e.g. label_smoothing=0.1."
        )
    _check_augment_model(config)
    return config


def _check_augment_model(config) -> None:
    from layoutlab import models

    on = [
        f"{name}={getattr(config, name)}"
        for name in ("auto_augment", "random_erasing", "mixup", "cutmix", "label_smoothing")
        if getattr(config, name) not in (None, 0, 0.0)
    ]
    if not on:
        return
    spec = models.spec(config.model)  # an unknown name: ValueError listing the known ones
    if spec.num_spatial != 2:
        raise ValueError(
            f"{', '.join(on)}: the augmentations work on 2D images, and model={config.model!r} "
            f"takes {spec.num_spatial}D inputs; drop them or pick a 2D model."
        )
    if spec.per_pixel:
        raise ValueError(
            f"{', '.join(on)}: model={config.model!r} predicts a label per pixel, which these "
            "would have to move and mix with the image (they mix one label per image, and "
            "the geometric ops and erasing leave the label map as it is); drop them for it."
        )
