"""``TrainConfig``: every setting of a training run, its overrides and its validation.

``validate`` runs before anything is built or compiled, so a bad value fails in
milliseconds with a message naming the field and the fix.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

# This module is imported to build `layoutlab train --help`, which must not start JAX:
# what checks a config (JAX, flax, the data loaders) is imported by the checks themselves.
from layoutlab.nn.conv_algos.plan import ConvPlan
from layoutlab.train.config_checks import (
    OPTIMIZERS,
    SCHEDULES,
    check_augment,
    check_conv,
    check_init,
    check_names,
    check_numbers,
    check_recipes,
    check_validation,
)
from layoutlab.train.config_text import parse_field_text, parse_kwarg, parse_option
from layoutlab.train.image_size import image_size_value

__all__ = [
    "OPTIMIZERS",
    "SCHEDULES",
    "TrainConfig",
    "apply_overrides",
    "data_parallel_on",
    "eval_batch_on",
    "validate",
    "with_legacy_defaults",
]

# Fields whose default became the fast configuration (issue 20): a saved config without
# them was written when these were the defaults, so with_legacy_defaults fills these in.
_LEGACY_DEFAULTS = {
    "conv_algorithm": "xla",
    "kernel_storage": "layout",
    "activation_storage": "layout",
    "cpu_fast": False,
}


def with_legacy_defaults(saved: dict) -> dict:
    """A saved config dict with the fields it lacks among those whose default changed set to
    the value the run ran with (a run saved before a default changed keeps what it ran with)."""
    return {**{k: v for k, v in _LEGACY_DEFAULTS.items() if k not in saved}, **saved}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """One training run, as asked, checked (``validate``) and recorded (``to_dict``): its
    ``None`` and ``"auto"`` fields are resolved from the others by ``train.spec.resolve_spec``,
    whose ``RunSpec.config`` is the run's record with them filled in."""

    model: str = "small_cnn"
    model_kwargs: dict = dataclasses.field(default_factory=dict)
    data: str = "digits"
    layout: str = "NHWC"
    precision: str = "fp32"
    # "auto": "dynamic" when the policy computes in float16, else "none". None means "none"
    # (no scaling), never the automatic choice.
    loss_scale: str | None = "auto"
    optimizer: str = "adamw"
    learning_rate: float = 0.003
    momentum: float = 0.9
    weight_decay: float = 0.0001
    schedule: str = "cosine"
    # None: 5% of the optimizer steps (or warmup_epochs).
    warmup_steps: int | None = None
    # Warmup in epochs (a fraction is fine), made optimizer steps with the run's steps per
    # epoch; set this or warmup_steps, not both. The warmup rises linearly from min_lr.
    warmup_epochs: float | None = None
    # The floor of the learning rate: cosine ends at it, step decay never goes below it.
    min_lr: float = 0.0
    # schedule="step": the epochs (strictly increasing, inside the run) at which the
    # learning rate is multiplied by lr_decay_rate, as torch's MultiStepLR milestones.
    lr_decay_epochs: list | None = None
    # schedule="step": the factor of each decay, in (0, 1].
    lr_decay_rate: float = 0.1
    # Clip the optimizer step's whole (accumulated, unscaled) gradient to this global L2
    # norm, as torch.nn.utils.clip_grad_norm_; None: no clipping.
    clip_grad_norm: float | None = None
    # An exponential moving average of the weights (and BatchNorm statistics) with this
    # decay per optimizer step, in [0, 1), e.g. 0.9998; evaluated beside the raw weights.
    # None or 0: none.
    ema_decay: float | None = None
    epochs: int = 5
    # Optimizer steps; overrides epochs when set.
    num_steps: int | None = None
    batch_size: int = 32
    # The most test images per eval step: the split goes in equal batches of at most this,
    # the last padded (train.evaluation.eval_batches). None: max(batch_size, 512) rounded
    # up to a multiple of the device count.
    eval_batch_size: int | None = None
    accum_steps: int = 1
    remat: bool = False
    # Random crop after zero padding by 4, and horizontal flip, of each training image on
    # device (layoutlab.data.augmentation).
    augment: bool = False
    # Per-image auto-augmentation on device after the crop and flip, in timm's form: "trivial"
    # (TrivialAugment-Wide) or "rand-mM-nN" (RandAugment: N ops per image at magnitude M of
    # 10); None: none (layoutlab.data.auto_augment).
    auto_augment: str | None = None
    # Probability that a training image gets one random rectangle erased (timm's --reprob).
    random_erasing: float = 0.0
    # What an erased rectangle holds: "pixel" (normal noise per value) or "const" (zeros: the
    # data set's mean).
    random_erasing_mode: str = "pixel"
    # Mixup's alpha: each batch is blended with its reverse at lam ~ Beta(alpha, alpha); 0: off.
    mixup: float = 0.0
    # CutMix's alpha (a box of the reversed batch pasted, lam = the share left); 0: off. With
    # mixup on too, each batch is one of the two with probability 1/2.
    cutmix: float = 0.0
    # Label smoothing of the training targets (optax.smooth_labels), in [0, 1); 0: off.
    label_smoothing: float = 0.0
    # Seed of the init, the shuffling, dropout and every augmentation draw.
    seed: int = 0
    # Optimizer steps between evaluations; None: once per epoch.
    eval_every: int | None = None
    # Optimizer steps between checkpoints; None: at every evaluation.
    checkpoint_every: int | None = None
    keep_checkpoints: int = 3
    # The fraction of each class of the train split held out as the validation split (the
    # same images for every seed, layout and device count): evaluations during training run
    # on it (val_loss, val_accuracy) and the test split is evaluated once, at the end. 0: no
    # validation split; evaluations run on the test split.
    val_fraction: float = 0.0
    # The metric whose best checkpoint is kept in <workdir>/best, beside the newest ones:
    # val_accuracy, val_loss, test_accuracy or test_loss, with ":max" or ":min" for which way
    # is better (default: max for accuracy, min for loss). None: no best checkpoint.
    keep_best: str | None = None
    # Stop after this many evaluations in a row without a better keep_best metric (the test
    # split is still evaluated at the end). None: train every step.
    early_stop: int | None = None
    # None: True when there is more than one device.
    data_parallel: bool | None = None
    # Every 2D conv's algorithm (layoutlab.nn.conv_algos.algorithm_names() or "auto": the
    # per-shape choice of conv_plan) and its kernel storage ("layout", "channels_last" or
    # "auto": channels_last on CPU, layout elsewhere; stored resolved).
    conv_algorithm: str = "auto"
    kernel_storage: str = "auto"
    # Where a channels-first model computes: "layout", "channels_last" (NHWC inside, inputs
    # and outputs still in `layout`) or "auto": channels_last on CPU, layout elsewhere.
    activation_storage: str = "auto"
    # How the layers besides convs that have a oneDNN primitive compute (BatchNorm in training
    # on bfloat16 activations, 2D max pools with overlapping windows): "auto": oneDNN's
    # primitive where it applies (on CPU, with the extension built), "xla": XLA's ops
    # everywhere (to compare the two, or to run as an exported model does). A data-parallel
    # run runs XLA's either way.
    layer_impl: str = "auto"
    # XLA compile options (name -> bool/int/float/str) of the train, eval and init programs,
    # over cpu_fast_options(mode) on CPU when cpu_fast (layoutlab.fast_defaults).
    xla_options: dict = dataclasses.field(default_factory=dict)
    cpu_fast: bool = True
    # What each "auto" conv runs: a ConvPlan (layoutlab.nn.conv_algos; given as its dict, the
    # JSON form, it is parsed when the config is made), autotuned (`train`, when tuning pays)
    # or None: the shipped table's plan, filled in and stored in config.json when the run
    # starts (layoutlab.nn.conv_algos.default_plan).
    conv_plan: ConvPlan | None = None
    # The plan of the eval step's "auto" convs at the eval batch, stored here when the run
    # starts: the table's inference rules for that batch, with a tuned conv_plan's entries
    # for the shapes they were made for; None: the eval step runs conv_plan (a given one, a
    # tuned one at an eval batch equal to the training batch, or a run from before).
    eval_conv_plan: ConvPlan | None = None
    # Folder data only: every image resized (bilinear) to [H, W]; None: the images' own size,
    # which must then be one size. An int n means [n, n].
    image_size: list | None = None
    # Optimizer steps between per-step train records (steps.jsonl, TensorBoard); 0: none.
    log_every: int = 10
    # TensorBoard event files in <workdir>/tensorboard (tensorboardX).
    tensorboard: bool = True
    # "replicated": each device holds the whole train state; "fsdp": parameters and
    # optimizer state are split over the data axis too (about 1/N of them per device).
    param_sharding: str = "replicated"
    # What the training data was read from, filled in when the run starts (files read:
    # {"files", "bytes", "sha256"} of them; synthetic data: {"source"}); a resume on other
    # data is refused.
    data_fingerprint: dict | None = None
    # The run's identity, made when it first starts and kept by --resume: every checkpoint
    # records it, and readers use no checkpoint of another run (train.checkpoint_io).
    run_id: str | None = None
    # The JAX settings that change a run's numbers (jax_enable_x64, the default matmul
    # precision, the PRNG), recorded when the run starts; a resume under others is refused.
    jax_numerics: dict | None = None
    # Weights to start from (train.init_weights): a PyTorch state dict file (.pth/.pt, with
    # torchvision's names; needs torch) or another layoutlab run's workdir (its newest
    # checkpoint), in either layout; a classifier head of another class count is
    # re-initialized. None: a fresh initialization from the seed. Stored as an absolute path.
    init: str | None = None
    # What init was read from, filled in when the run starts ({"sha256"} of the file, or
    # {"run_id", "step", "sha256"} of the run's checkpoint); a resume from other weights is
    # refused.
    init_fingerprint: dict | None = None
    # Linear probing: only the classifier head trains (the parameters whose shapes follow the
    # class count); the rest keep their init weights bit for bit and their BatchNorm layers
    # run in eval mode (running statistics used and kept). Needs init.
    freeze_backbone: bool = False

    def __post_init__(self):
        # One form of a plan from here on: a ConvPlan (its dict is the JSON of to_dict).
        for name in PLAN_FIELDS:
            object.__setattr__(self, name, _plan_value(name, getattr(self, name)))

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for name in PLAN_FIELDS:
            d[name] = None if d[name] is None else d[name].to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        if not isinstance(d, dict):
            raise ValueError(f"A TrainConfig dict must be a dict, got {type(d).__name__}.")
        unknown = sorted(set(d) - set(field_names()))
        if unknown:
            raise ValueError(
                f"Unknown TrainConfig fields {unknown}; valid fields are: "
                f"{', '.join(field_names())}."
            )
        d = with_legacy_defaults(d)
        return cls(**{k: _coerce(k, v) for k, v in d.items()})


PLAN_FIELDS = ("conv_plan", "eval_conv_plan")


def _plan_value(name: str, value) -> ConvPlan | None:
    if value is None or isinstance(value, ConvPlan):
        return value
    try:
        return ConvPlan.from_dict(value)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(TrainConfig)]


@functools.cache
def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(TrainConfig)


def _split_optional(tp) -> tuple[type, bool]:
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


def _coerce(name: str, value):
    """Checks a python value's type for field ``name`` (ints pass as floats)."""
    if name == "image_size" and value is not None:
        return image_size_value(value)
    if name in PLAN_FIELDS:
        return _plan_value(name, value)
    base, optional = _split_optional(_field_types()[name])
    if value is None:
        if optional:
            return None
        raise ValueError(f"TrainConfig.{name} cannot be None.")
    ok = isinstance(value, base) and not (base is int and isinstance(value, bool))
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not ok:
        raise ValueError(
            f"TrainConfig.{name} must be {base.__name__}{' or None' if optional else ''}, "
            f"got {value!r}."
        )
    return value


# Dict fields whose single entries ``FIELD.NAME=VALUE`` sets, with each value's parser.
_DICT_ENTRIES = {"model_kwargs": parse_kwarg, "xla_options": parse_option}


def apply_overrides(config: TrainConfig, overrides: list[str]) -> TrainConfig:
    """``["epochs=3", "lr=..."]`` -> a new config; ``model_kwargs.width=8`` sets one kwarg
    and ``xla_options.NAME=VALUE`` one XLA compile option."""
    changes: dict[str, Any] = {}
    entries = {name: dict(getattr(config, name)) for name in _DICT_ENTRIES}
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"Override {item!r} is not of the form field=value.")
        field, dot, entry = key.partition(".")
        if dot and field in _DICT_ENTRIES:
            if not entry:
                raise ValueError(f"Override {item!r} names no {field} entry ({field}.NAME=VALUE).")
            entries[field][entry] = _DICT_ENTRIES[field](value)
            continue
        if key not in field_names():
            raise ValueError(
                f"Unknown config field {key!r} in {item!r}; valid fields are: "
                f"{', '.join(field_names())} (and model_kwargs.NAME, xla_options.NAME)."
            )
        base, optional = _split_optional(_field_types()[key])
        base = dict if key in PLAN_FIELDS else base  # a plan's JSON form
        changes[key] = parse_field_text(key, value, base, optional)
        if key in _DICT_ENTRIES:
            entries[key] = dict(changes[key])
    changes.update(entries)
    return dataclasses.replace(config, **changes)


def _check_devices(config: TrainConfig, num_devices: int) -> None:
    if not data_parallel_on(config, num_devices):
        return
    batches = {
        "batch_size": config.batch_size,
        "eval_batch_size": eval_batch_on(config, num_devices),
    }
    for name, value in batches.items():
        if value % num_devices:
            lower = max(num_devices, value - value % num_devices)
            raise ValueError(
                f"{name}={value} is not divisible by the {num_devices} devices it is split "
                f"over; use a multiple of {num_devices} (e.g. {lower}) or data_parallel=false."
            )


def data_parallel_on(config: TrainConfig, num_devices: int) -> bool:
    """Whether ``config`` splits its batches over ``num_devices`` (None: when there are
    several)."""
    return num_devices > 1 if config.data_parallel is None else config.data_parallel


def eval_batch_on(config: TrainConfig, num_devices: int) -> int:
    """``config``'s ``eval_batch_size`` on ``num_devices`` (None: ``max(batch_size, 512)``,
    rounded up to a multiple of the devices when data parallel)."""
    if config.eval_batch_size is not None:
        return config.eval_batch_size
    eval_batch = max(config.batch_size, 512)
    if data_parallel_on(config, num_devices):
        eval_batch = -(-eval_batch // num_devices) * num_devices
    return eval_batch


def validate(config: TrainConfig, num_devices: int) -> TrainConfig:
    """Checks every field and returns the config (its ``image_size`` in the one stored form);
    raises ``ValueError`` naming the fix. The automatic fields stay as asked:
    ``train.spec.resolve_spec`` fills them in (its ``RunSpec.config``, what a run records).

    Nothing is built or compiled here, so this fails fast.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"Expected a TrainConfig, got {type(config).__name__}.")
    for name in field_names():
        _coerce(name, getattr(config, name))
    if config.image_size is not None:  # one stored form: [H, W]
        config = dataclasses.replace(config, image_size=image_size_value(config.image_size))
    check_numbers(config)
    check_recipes(config)
    config = check_augment(config)
    policy = check_names(config)
    from layoutlab.train.model_checks import check_model

    check_model(config.model, config.model_kwargs, remat=config.remat)
    check_conv(config, policy)
    check_init(config)
    check_validation(config)
    _check_devices(config, num_devices)
    return config
