"""``TrainConfig``: every setting of a training run, its overrides and its validation.

``validate`` runs before anything is built or compiled, so a bad value fails in
milliseconds with a message naming the field and the fix.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import struct
import types
import typing
from typing import Any

# This module is imported to build `layoutlab train --help`, which must not start JAX:
# what checks a config (JAX, flax, the data loaders) is imported by the checks themselves.
from layoutlab.nn.conv_algos.plan import ConvPlan
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

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
SCHEDULES = ("constant", "cosine")
AUTO_LOSS_SCALE = "auto"  # as train.run_precision (imported lazily: no JAX for --help)
INT32_MAX = 2**31 - 1
AUTO_STORAGE = "auto"  # kernel/activation storage: resolved per backend (fast_defaults)
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
    # None: 5% of the optimizer steps.
    warmup_steps: int | None = None
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
    augment: bool = False
    seed: int = 0
    # Optimizer steps between evaluations; None: once per epoch.
    eval_every: int | None = None
    # Optimizer steps between checkpoints; None: at every evaluation.
    checkpoint_every: int | None = None
    keep_checkpoints: int = 3
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
    # {"files", "bytes", "sha256"} of them; synthetic data: its spec); a resume on other
    # data is refused.
    data_fingerprint: dict | None = None
    # The run's identity, made when it first starts and kept by --resume: every checkpoint
    # records it, and readers use no checkpoint of another run (train.checkpoint_io).
    run_id: str | None = None
    # The JAX settings that change a run's numbers (jax_enable_x64, the default matmul
    # precision, the PRNG), recorded when the run starts; a resume under others is refused.
    jax_numerics: dict | None = None

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


def _check_positive(config: TrainConfig, *names: str, allow_none: bool = False) -> None:
    for name in names:
        value = getattr(config, name)
        if value is None and allow_none:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        _check_int32(name, value)


def _check_int32(name: str, value: int) -> None:
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
    config: TrainConfig, name: str, low: float, high: float | None = None, *, low_open: bool = False
) -> None:
    """``getattr(config, name)`` must be finite and in ``[low, high)`` (``(low, ...`` when
    ``low_open``) as the float32 it trains as; NaN and infinities fail every comparison that
    lets a value through."""
    value = getattr(config, name)
    default = getattr(TrainConfig(), name)
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


def _check_numbers(config: TrainConfig) -> None:
    _check_positive(config, "epochs", "batch_size", "accum_steps", "keep_checkpoints")
    _check_positive(
        config, "num_steps", "eval_batch_size", "eval_every", "checkpoint_every", allow_none=True
    )
    if not isinstance(config.log_every, int) or config.log_every < 0:
        raise ValueError(
            f"log_every must be an integer >= 0 (0: no per-step log), got {config.log_every!r}."
        )
    _check_int32("log_every", config.log_every)
    if config.warmup_steps is not None:
        if config.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0 or None, got {config.warmup_steps}.")
        _check_int32("warmup_steps", config.warmup_steps)
    _check_float(config, "learning_rate", 0.0, low_open=True)
    _check_float(config, "weight_decay", 0.0)
    _check_float(config, "momentum", 0.0, 1.0)
    if not 0 <= config.seed < 2**31:
        raise ValueError(f"seed must lie in [0, 2**31), got {config.seed}.")


def _check_names(config: TrainConfig):
    """Checks the names; returns the ``Policy`` of ``config.precision`` (read here once)."""
    from layoutlab.data import SPEC_FORMS
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
    if name not in {form.split(":")[0].split("[")[0] for form in SPEC_FORMS}:
        forms = ", ".join(SPEC_FORMS)
        raise ValueError(f"Unknown data set {config.data!r}; valid forms are: {forms}.")
    if config.image_size is not None and name != "folder":
        raise ValueError(
            f"image_size resizes folder data only; {config.data!r} has a fixed image size: "
            "drop image_size, or use folder:DIR."
        )
    return policy


def _check_conv(config: TrainConfig, policy) -> None:
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
    _check_numbers(config)
    policy = _check_names(config)
    from layoutlab.train.model_checks import check_model

    check_model(config.model, config.model_kwargs, remat=config.remat)
    _check_conv(config, policy)
    _check_devices(config, num_devices)
    return config
