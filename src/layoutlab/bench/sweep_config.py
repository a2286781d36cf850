"""What a sweep measures (``SweepConfig``), checked and made canonical before anything runs
(``validate``), and the model-input and XLA-option helpers the autotuners share."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from layoutlab import models
from layoutlab.arguments import CONV_TUNE_CHOICES
from layoutlab.bench.cases import MODES
from layoutlab.bench.stats import AUTO_BUDGET_S
from layoutlab.fast_defaults import (
    default_activation_storage,
    default_kernel_storage,
    resolve_activation_storage,
    resolve_kernel_storage,
)
from layoutlab.nn.conv_config import check_conv_options
from layoutlab.precision import get_policy
from layoutlab.train.config import TrainConfig
from layoutlab.train.spec import config_for
from layoutlab.xla import resolve_backend
from layoutlab.xla.flags import normalize_flags, translate_compile_error

__all__ = [
    "MEMORY_FORMATS",
    "SweepConfig",
    "base_config",
    "check_compile_options",
    "config_dict",
    "defaults_label",
    "options_for",
    "resolve_input",
    "validate",
]

MEMORY_FORMATS = ("contiguous", "channels_last")


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """What to measure. ``image_size``: spatial sizes (None: the model's default, 224 for
    an ImageNet stem); ``num_classes`` None: 1000 for an ImageNet stem, else 10.
    ``xla_options``: XLA compile options for layoutlab's steps (and its conv autotuning),
    e.g. ``{"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}``.
    """

    model: str
    layouts: Sequence[str] = ("NHWC", "NCHW")
    precisions: Sequence[str] = ("fp32", "mixed_bf16")
    batch_sizes: Sequence[int] = (32,)
    modes: Sequence[str] = ("infer", "train")
    model_kwargs: dict = dataclasses.field(default_factory=dict)
    image_size: Sequence[int] | None = None
    channels: int | None = None
    num_classes: int | None = None
    backend: str | None = None
    # "auto": measured rounds until each median is known within ``target`` (95% interval)
    # and each layoutlab/baseline ratio is settled (bench.sweep._settled), or a group's
    # rounds took ``time_budget_s``, at least bench.stats.MIN_REPEATS; or a count.
    repeats: int | str = "auto"
    warmup: int = 2
    target: float = 0.03
    time_budget_s: float = AUTO_BUDGET_S
    torch: bool = False
    torch_compile: bool = False
    max_step_s: float | None = None  # skip configurations whose steps take longer
    note: str | None = None
    # layoutlab's conv settings: each algorithm is one more configuration ("auto": a plan
    # per conv shape from the autotune cache, a tuning (conv_tune) or the shipped table);
    # the kernel and activation storages ("auto": fast_defaults.default_kernel_storage and
    # default_activation_storage) and XLA compile options apply to all.
    conv_algorithms: Sequence[str] = ("auto",)
    kernel_storage: str = "auto"
    activation_storage: str = "auto"
    xla_options: dict = dataclasses.field(default_factory=dict)
    conv_tune_repeats: int = 6
    # "auto": tune only when the cache lacks a shape and tuning costs <= 10% of the
    # measured steps (never, for a benchmark's few steps); "always"; "never".
    conv_tune: str = "auto"
    # On CPU, add fast_defaults.fast_compile_options(mode) under xla_options (which
    # override them); other backends never get CPU options.
    cpu_fast: bool = True
    # Also run every layout x precision in plain XLA (xla convs, the layout's kernels, no
    # compile options), interleaved with the rest, rows marked defaults="plain".
    baseline_plain: bool = False
    # Measure the machine's float32 matmul peak and copy bandwidth once (bench.roofline) and
    # give every row its share of that peak.
    roofline: bool = True
    # The train step's optimizer (train.spec.OPTIMIZER_CHOICES): "train", what `layoutlab
    # train` runs for the same flags (AdamW), or "pytorch", the PyTorch runner's SGD with
    # momentum. None: "pytorch" with torch (both sides make the same update), else "train".
    optimizer: str | None = None


def _builder_default(name: str, option: str):
    builder = models.spec(name).builder
    target = getattr(builder, "func", builder)
    fn = target.__init__ if isinstance(target, type) else target
    param = inspect.signature(fn).parameters.get(option)
    return None if param is None or param.default is param.empty else param.default


def resolve_input(
    model: str, model_kwargs: dict, image_size=None, channels=None, num_classes=None
) -> tuple[tuple[int, ...], int]:
    """``((*spatial, channels), num_classes)`` with the defaults filled in."""
    spec = models.spec(model)
    imagenet = model_kwargs.get("stem", _builder_default(model, "stem")) == "imagenet"
    shape = models.example_shape(model, 224 if image_size is None and imagenet else image_size)
    if shape is None or min(shape[:-1]) < 1:
        raise ValueError(
            f"image_size {image_size!r} does not fit {model}, which takes "
            f"{spec.num_spatial} positive spatial sizes."
        )
    spatial = shape[:-1]
    chans = spec.default_input[-1] if channels is None else int(channels)
    classes = (1000 if imagenet else 10) if num_classes is None else int(num_classes)
    return (*(int(s) for s in spatial), chans), classes


def _positive_ints(values, what: str) -> tuple[int, ...]:
    out = tuple(values)
    if not out or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in out):
        raise ValueError(f"{what} must be a non-empty list of positive ints, got {values!r}.")
    return out


def validate(config: SweepConfig) -> SweepConfig:
    """The config with canonical names, or a ``ValueError`` naming what is wrong."""
    spec = models.spec(config.model)  # unknown model: ValueError listing the known ones
    layouts = tuple(
        dict.fromkeys(models.resolve_layout(x, spec.num_spatial).name for x in config.layouts)
    )
    if not layouts:
        raise ValueError("layouts is empty; give at least one, e.g. NHWC.")
    precisions = tuple(dict.fromkeys(config.precisions))
    if not precisions:
        raise ValueError("precisions is empty; give at least one, e.g. fp32.")
    for p in precisions:
        get_policy(p)  # unknown precision: ValueError listing the presets
    modes = tuple(dict.fromkeys(config.modes))
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ValueError(f"Unknown modes {bad or modes!r}; use any of: {', '.join(MODES)}.")
    batches = _positive_ints(config.batch_sizes, "batch_sizes")
    if config.max_step_s is not None and not config.max_step_s > 0:
        raise ValueError(
            f"max_step_s must be a positive number of seconds, got {config.max_step_s}."
        )
    auto = config.repeats == "auto"
    if not auto and not (isinstance(config.repeats, int) and config.repeats >= 1):
        raise ValueError(f"repeats must be 'auto' or an integer >= 1, got {config.repeats!r}.")
    if config.warmup < 0:
        raise ValueError(f"Need warmup >= 0, got warmup={config.warmup}.")
    if not (0 < config.target < 1 and config.time_budget_s > 0):
        raise ValueError(
            f"target must lie in (0, 1) and time_budget_s be > 0, got {config.target} and "
            f"{config.time_budget_s}."
        )
    backend = resolve_backend(config.backend)  # unknown or absent: BackendError (ValueError)
    algos = tuple(dict.fromkeys(config.conv_algorithms))
    if not algos:
        raise ValueError("conv_algorithms is empty; give at least one, e.g. xla.")
    for name in algos:
        check_conv_options(name, None)
    storage = resolve_kernel_storage(config.kernel_storage, backend.platform)
    activations = resolve_activation_storage(config.activation_storage, backend.platform)
    check_conv_options(None, storage, activations)
    if config.conv_tune not in CONV_TUNE_CHOICES:
        raise ValueError(f"conv_tune must be auto, always or never, got {config.conv_tune!r}.")
    if config.conv_tune_repeats < 1:
        raise ValueError(f"conv_tune_repeats must be >= 1, got {config.conv_tune_repeats}.")
    optimizer = _check_optimizer(config)
    xla_options = check_compile_options(config.xla_options, backend.name)
    if config.cpu_fast:  # the fast options were probed; the user's may clash with them
        for mode in modes:
            check_compile_options(options_for(config, mode, backend.platform), backend.name)
    shape, classes = resolve_input(
        config.model, config.model_kwargs, config.image_size, config.channels, config.num_classes
    )
    # Unknown model options fail here rather than in every configuration of the sweep;
    # eval_shape builds the model abstractly, without computing (or compiling) anything.
    nnx.eval_shape(
        lambda: models.create(
            config.model, num_classes=classes, in_channels=shape[-1], **config.model_kwargs
        )
    )
    return dataclasses.replace(
        config,
        layouts=layouts,
        precisions=precisions,
        modes=modes,
        batch_sizes=batches,
        image_size=shape[:-1],
        channels=shape[-1],
        num_classes=classes,
        conv_algorithms=algos,
        xla_options=xla_options,
        kernel_storage=storage,
        activation_storage=activations,
        backend=config.backend,
        optimizer=optimizer,
    )


def _optimizer(config: SweepConfig) -> str:
    """The train step's optimizer choice, unchecked: the given one, else PyTorch's update
    with ``torch`` and ``layoutlab train``'s without."""
    return config.optimizer or ("pytorch" if config.torch else "train")


def _check_optimizer(config: SweepConfig) -> str:
    """The train step's optimizer choice; PyTorch rows run SGD with momentum, so with
    ``torch`` layoutlab runs it too, or the ratios would compare different updates."""
    from layoutlab.train.spec import OPTIMIZER_CHOICES

    choice = _optimizer(config)
    if choice not in OPTIMIZER_CHOICES:
        raise ValueError(
            f"Unknown optimizer {choice!r}; use train (what `layoutlab train` runs) or pytorch."
        )
    if config.torch and choice != "pytorch":
        raise ValueError(
            "--torch times PyTorch's SGD-with-momentum step beside layoutlab's, which must "
            "make the same update: drop --optimizer train (with --torch it is pytorch), or drop "
            "--torch."
        )
    return choice


def check_compile_options(options: dict | None, backend: str | None = None) -> dict:
    """``options`` normalised, after XLA accepted them on a one-op program: a misspelt name
    or a badly typed value fails here, naming the flag, instead of in every configuration."""
    opts = normalize_flags(options)
    if opts:
        x = jax.device_put(np.float32(1), resolve_backend(backend).device)
        try:
            jax.jit(lambda v: v + 1).lower(x).compile(compiler_options=opts)
        except Exception as err:
            translated = translate_compile_error(err, opts, backend)
            if translated is None:
                raise
            raise translated from None
    return opts


def base_config(config: SweepConfig) -> TrainConfig:
    """The ``TrainConfig`` every configuration of the sweep shares (``train.spec.config_for``):
    its model, conv storages, XLA options, ``cpu_fast`` and train step's optimizer; the
    layouts, precisions, batch sizes, modes and conv algorithms are the sweep's axes."""
    return config_for(
        _optimizer(config),
        model=config.model,
        model_kwargs=dict(config.model_kwargs),
        kernel_storage=config.kernel_storage,
        activation_storage=config.activation_storage,
        xla_options=dict(config.xla_options),
        cpu_fast=config.cpu_fast,
    )


def options_for(
    config: SweepConfig, mode: str, backend: str | None = None, batch: int | None = None
) -> dict:
    """The XLA compile options of layoutlab's ``mode`` steps at ``batch`` on ``backend``:
    ``train.fast_config.compile_options`` of the sweep's ``base_config`` on its input."""
    from layoutlab.train.fast_config import compile_options

    shape = None
    if config.cpu_fast:
        shape, _ = resolve_input(
            config.model, dict(config.model_kwargs), config.image_size, config.channels
        )
    return compile_options(
        base_config(config), mode, backend=backend, batch=batch, input_shape=shape
    )


def defaults_label(config: SweepConfig, algo: str, backend: str) -> str:
    """``"fast"`` when a case runs layoutlab's defaults, else ``"custom"``."""
    fast = (
        algo == "auto"
        and config.cpu_fast
        and not config.xla_options
        and config.kernel_storage == default_kernel_storage(backend)
        and config.activation_storage == default_activation_storage(backend)
    )
    return "fast" if fast else "custom"


def config_dict(config: SweepConfig) -> dict:
    out = dataclasses.asdict(config)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}
