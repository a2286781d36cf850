"""What a sweep measures (``SweepConfig``: a run, the axes over its fields and how to
measure; checked by ``bench.sweep_checks.validate``), and the model-input and XLA-option
helpers the sweep and the autotuners share."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping, Sequence

import jax
import numpy as np

from layoutlab import models
from layoutlab.bench.stats import AUTO_BUDGET_S
from layoutlab.fast_defaults import default_activation_storage, default_kernel_storage
from layoutlab.train.config import TrainConfig
from layoutlab.xla import resolve_backend
from layoutlab.xla.flags import normalize_flags, translate_compile_error

__all__ = [
    "DEFAULT_AXES",
    "MEMORY_FORMATS",
    "SweepConfig",
    "check_compile_options",
    "config_dict",
    "defaults_label",
    "options_for",
    "point_input",
    "resolve_input",
]

MEMORY_FORMATS = ("contiguous", "channels_last")
# The axes of a sweep given none: both layouts and both precision classes.
DEFAULT_AXES = {"layout": ("NHWC", "NCHW"), "precision": ("fp32", "mixed_bf16")}


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """What to measure: ``run``, the ``TrainConfig`` every configuration shares (model,
    ``model_kwargs``, conv settings, XLA options, ``cpu_fast``, optimizer...), and ``axes``,
    a ``TrainConfig`` field -> the values it takes (``layout``, ``precision``,
    ``batch_size``, ``conv_algorithm``; any field): each point of the axes is one
    configuration, ``dataclasses.replace(run, **point)``, in each of ``modes``. E.g.
    ``SweepConfig(TrainConfig(model="resnet18"), {"batch_size": (8, 32)})``.

    ``image_size``: spatial sizes (None: the model's default, 224 for an ImageNet stem);
    ``num_classes`` None: 1000 for an ImageNet stem, else 10. The run's ``xla_options`` go to
    layoutlab's steps (and their conv autotuning); with ``cpu_fast``, on CPU, over
    ``fast_defaults.fast_compile_options(mode)`` at each configuration's batch. With
    ``torch`` the run must make PyTorch's update: ``train.spec.config_for("pytorch", ...)``.
    """

    run: TrainConfig
    axes: Mapping[str, Sequence] = dataclasses.field(default_factory=lambda: dict(DEFAULT_AXES))
    modes: Sequence[str] = ("infer", "train")
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
    # An "auto" conv_algorithm's plan per conv shape: from the autotune cache, a tuning or
    # the shipped table. "auto": tune only when the cache lacks a shape and tuning costs
    # <= 10% of the measured steps (never, for a benchmark's few steps); "always"; "never".
    conv_tune: str = "auto"
    conv_tune_repeats: int = 6
    # Inference rows: oneDNN's convs read kernels packed once (nn.conv_algos.onednn_packed).
    pack_kernels: bool = True
    # Also run every point in plain XLA (xla convs, the layout's kernels and activations, XLA's
    # batch norms and max pools, no compile options), interleaved with the rest, rows marked
    # defaults="plain".
    baseline_plain: bool = False
    # Measure the machine's float32 matmul peak and copy bandwidth once (bench.roofline) and
    # give every row its share of that peak.
    roofline: bool = True


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


def point_input(config: SweepConfig, run: TrainConfig) -> tuple[tuple[int, ...], int]:
    """``resolve_input`` of a configuration's ``run`` on the sweep's input settings."""
    return resolve_input(
        run.model, run.model_kwargs, config.image_size, config.channels, config.num_classes
    )


def options_for(
    config: SweepConfig,
    mode: str,
    backend: str | None = None,
    batch: int | None = None,
    run: TrainConfig | None = None,
) -> dict:
    """The XLA compile options of ``run``'s (None: the sweep's run) ``mode`` steps at
    ``batch`` examples on ``backend``: ``train.fast_config.compile_options`` on the sweep's
    input."""
    from layoutlab.train.fast_config import compile_options

    run = config.run if run is None else run
    shape = point_input(config, run)[0] if run.cpu_fast else None
    return compile_options(run, mode, backend=backend, batch=batch, input_shape=shape)


def defaults_label(run: TrainConfig, backend: str) -> str:
    """``"fast"`` when a configuration's run is layoutlab's defaults, else ``"custom"``."""
    fast = (
        run.conv_algorithm == "auto"
        and run.cpu_fast
        and not run.xla_options
        and run.kernel_storage == default_kernel_storage(backend)
        and run.activation_storage == default_activation_storage(backend)
        and run.layer_impl == "auto"
    )
    return "fast" if fast else "custom"


def config_dict(config: SweepConfig) -> dict:
    """The sweep as JSON values (``machine.json``'s ``sweep``): its run as ``to_dict`` gives
    it, its axes as lists."""
    out = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    out["run"] = config.run.to_dict()
    out["axes"] = {name: list(values) for name, values in config.axes.items()}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}
