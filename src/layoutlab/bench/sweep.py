"""The sweep: model x layout x precision x batch size x mode on one backend, with PyTorch
side by side.

Configurations run in groups that share a workload (model, input, mode, batch size,
precision class): every layoutlab and PyTorch configuration of a group is set up, warmed up,
and then timed round-robin, A B A B, so the layoutlab/PyTorch ratios come from the same
minutes of the same machine. A configuration that fails becomes an ``oom`` or ``error`` row
and the sweep goes on; bad arguments fail before anything runs.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
from collections.abc import Callable, Sequence

import jax
import numpy as np
from flax import nnx

from layoutlab import models
from layoutlab.bench.cases import MODES, JaxCase, TorchCase, Workload, make_workload
from layoutlab.bench.machine import finish_machine_info, machine_info
from layoutlab.bench.results import BenchResults, add_torch_ratios, precision_class, variant
from layoutlab.bench.status import OK, SKIPPED, classify_failure
from layoutlab.bench.timing import summarize, timed
from layoutlab.nn.conv_config import check_conv_options
from layoutlab.precision import get_policy
from layoutlab.xla import resolve_backend
from layoutlab.xla.flags import cpu_fast_options, normalize_flags, translate_compile_error

__all__ = [
    "SweepConfig",
    "check_compile_options",
    "resolve_input",
    "run_group",
    "run_sweep",
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
    repeats: int = 10
    warmup: int = 2
    torch: bool = False
    torch_compile: bool = False
    max_step_s: float | None = None  # skip configurations whose steps take longer
    note: str | None = None
    # layoutlab's conv settings: each algorithm is one more configuration ("auto": tuned
    # per conv shape, cached); the kernel storage and XLA compile options apply to all.
    conv_algorithms: Sequence[str] = ("xla",)
    kernel_storage: str = "layout"
    xla_options: dict = dataclasses.field(default_factory=dict)
    conv_tune_repeats: int = 3
    # Add layoutlab.xla.cpu_fast_options(mode) under xla_options (which override them).
    cpu_fast: bool = False


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
    if image_size is None:
        spatial = (224,) * spec.num_spatial if imagenet else spec.default_input[:-1]
    else:
        sizes = (image_size,) if isinstance(image_size, int) else tuple(image_size)
        spatial = sizes * spec.num_spatial if len(sizes) == 1 else sizes
        if len(spatial) != spec.num_spatial or min(spatial) < 1:
            raise ValueError(
                f"image_size {image_size!r} does not fit {model}, which takes "
                f"{spec.num_spatial} positive spatial sizes."
            )
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
    if "train" in modes and spec.task != "classification":
        raise ValueError(
            f"{config.model} is a {spec.task} model; the benchmark's train step is for "
            "classification. Use --modes infer for it."
        )
    batches = _positive_ints(config.batch_sizes, "batch_sizes")
    if config.max_step_s is not None and not config.max_step_s > 0:
        raise ValueError(
            f"max_step_s must be a positive number of seconds, got {config.max_step_s}."
        )
    if config.repeats < 1 or config.warmup < 0:
        raise ValueError(
            f"Need repeats >= 1 and warmup >= 0, got repeats={config.repeats}, "
            f"warmup={config.warmup}."
        )
    backend = resolve_backend(config.backend)  # unknown or absent: BackendError (ValueError)
    algos = tuple(dict.fromkeys(config.conv_algorithms))
    if not algos:
        raise ValueError("conv_algorithms is empty; give at least one, e.g. xla.")
    for name in algos:
        check_conv_options(name, None)
    check_conv_options(None, config.kernel_storage)
    if config.conv_tune_repeats < 1:
        raise ValueError(f"conv_tune_repeats must be >= 1, got {config.conv_tune_repeats}.")
    xla_options = check_compile_options(config.xla_options, backend.name)
    if config.cpu_fast:
        for mode in modes:
            check_compile_options(_options_for(config, mode), backend.name)
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
    )


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


def _options_for(config: SweepConfig, mode: str) -> dict:
    """The XLA compile options of layoutlab's ``mode`` steps."""
    base = cpu_fast_options(mode) if config.cpu_fast else {}
    return {**base, **config.xla_options}


def _interleave(*lists):
    """A1 B1 A2 B2 ...: the frameworks alternate in the timing rounds."""
    return [x for xs in itertools.zip_longest(*lists) for x in xs if x is not None]


def _groups(config: SweepConfig, torch_device: str | None):
    shape = (*config.image_size, config.channels)
    classes = list(dict.fromkeys(precision_class(p) for p in config.precisions))
    for mode, batch, cls in itertools.product(config.modes, config.batch_sizes, classes):
        w: Workload = make_workload(
            config.model, config.model_kwargs, shape, config.num_classes, mode, batch
        )
        options = tuple(sorted(_options_for(config, mode).items()))
        jax_cases = [
            JaxCase(w, layout, p, algo, config.kernel_storage, options)
            for p in config.precisions
            if precision_class(p) == cls
            for layout in config.layouts
            for algo in config.conv_algorithms
        ]
        torch_cases = []
        if torch_device is not None:
            from layoutlab.bench.torch_runner import torch_precisions

            compiled = (False, True) if config.torch_compile else (False,)
            torch_cases = [
                TorchCase(w, fmt, p, compile=c)
                for c in compiled
                for p in torch_precisions(torch_device, cls)
                for fmt in MEMORY_FORMATS
            ]
        yield jax_cases, torch_cases


def _row(runner, fields: dict, status: str = OK, error: str | None = None) -> dict:
    return {**runner.row(), **fields, "status": status, "error": error}


def _timing_fields(seconds: list[float], batch: int, flops, repeats: int, warmup: int) -> dict:
    stats = summarize(seconds)
    out = {
        "repeats": repeats,
        "warmup": warmup,
        "step_ms_median": stats.median_ms,
        "step_ms_min": stats.min_ms,
        "step_ms_max": stats.max_ms,
        "images_per_sec": batch / (stats.median_ms / 1e3),
    }
    if flops:
        out["gflops_per_sec"] = flops / (stats.median_ms / 1e3) / 1e9
    return out


@dataclasses.dataclass
class _Live:
    runner: object
    fields: dict
    seconds: list = dataclasses.field(default_factory=list)
    failure: tuple[str, str] | None = None


def run_group(
    runners,
    *,
    repeats: int,
    warmup: int,
    log: Callable[[str], None] | None = None,
    max_step_s: float | None = None,
    observed: dict | None = None,
):
    """Set up, warm up, then time ``runners`` round-robin; one row each, failures included.

    A runner whose first measured step takes longer than ``max_step_s`` stops there and
    gets a ``skipped`` row. ``observed[runner]`` receives each runner's median step time.
    """
    rows, live = [], []
    for r in runners:
        try:
            live.append(_Live(r, r.setup()))
        except Exception as err:  # each configuration fails on its own
            rows.append(_row(r, {}, *classify_failure(err)))
            r.close()

    def run(entry: _Live, measured: bool) -> None:
        try:
            t = timed(entry.runner.step)
        except Exception as err:
            entry.failure = classify_failure(err)
            entry.runner.close()
            return
        if not measured:
            return
        entry.seconds.append(t)
        # Only the first measured step decides: warm-up steps carry one-time costs, and
        # one slow step later on is noise, not a slow configuration.
        if max_step_s is not None and len(entry.seconds) == 1 and t > max_step_s:
            entry.failure = (
                SKIPPED,
                f"stopped: a measured step took {t:.1f} s, over the max_step_s limit of "
                f"{max_step_s:g} s",
            )
            entry.runner.close()

    for rounds, measured in ((warmup, False), (repeats, True)):
        for _ in range(rounds):
            for entry in live:
                if entry.failure is None:
                    run(entry, measured)
    for entry in live:
        r = entry.runner
        if observed is not None and entry.seconds:
            observed[r] = summarize(entry.seconds).median_ms / 1e3
        if entry.failure is not None:
            rows.append(_row(r, entry.fields, *entry.failure))
            continue
        try:
            fields = {**entry.fields, **r.finish()}
            batch = r.row()["batch_size"]
            fields.update(
                _timing_fields(entry.seconds, batch, fields.get("flops"), repeats, warmup)
            )
            rows.append(_row(r, fields))
        except Exception as err:
            rows.append(_row(r, entry.fields, *classify_failure(err)))
        finally:
            r.close()
    if log is not None:
        for row in rows:
            log(_describe(row))
    return rows


# Training costs about three forward passes; predictions use 2 so that they err towards
# running a configuration rather than skipping one that would have fit.
_TRAIN_OVER_INFER = 2.0


def _predicted_step_s(row: dict, history: list[tuple[dict, float]]) -> tuple[float, dict] | None:
    """The step time ``row`` should take, scaled linearly in batch size from the closest
    earlier run of the same framework, layout and precision: the same mode at the largest
    smaller batch, else an inference run (times ``_TRAIN_OVER_INFER`` for training)."""
    keys = ("framework", "layout", "precision", "model", "model_kwargs", "input_shape")
    keys += ("conv_algo", "kernel_storage", "xla_options", "memory_format")
    same = [
        (past, seconds)
        for past, seconds in history
        if all(past.get(k) == row.get(k) for k in keys) and past["batch_size"] <= row["batch_size"]
    ]
    for mode in (row["mode"], "infer"):
        runs = [(p, t) for p, t in same if p["mode"] == mode]
        if runs:
            past, seconds = max(runs, key=lambda run: run[0]["batch_size"])
            factor = row["batch_size"] / past["batch_size"]
            if mode != row["mode"]:
                factor *= _TRAIN_OVER_INFER
            return seconds * factor, past
    return None


def _skip_row(runner, guess: float, past: dict, limit: float) -> dict:
    message = (
        f"not run: predicted {guess:.1f} s per step from the {past['mode']} batch "
        f"{past['batch_size']} run, over the max_step_s limit of {limit:g} s"
    )
    return _row(runner, {}, SKIPPED, message)


def _describe(row: dict) -> str:
    what = (
        f"{row['framework']:<13} {row['mode']:<5} b={row['batch_size']:<4} "
        f"{row['layout']:<5} {row['precision']:<10} {variant(row)}"
    )
    if row["status"] != OK:
        return f"{what} {row['status'].upper()}: {(row.get('error') or '')[:160]}"
    return (
        f"{what} {row['images_per_sec']:10.1f} img/s  median {row['step_ms_median']:.2f} ms "
        f"(min {row['step_ms_min']:.2f}, max {row['step_ms_max']:.2f})"
    )


def _torch_device(config: SweepConfig, notes: list[str]) -> str | None:
    if not config.torch:
        return None
    from layoutlab.bench.torch_runner import TorchUnavailable, require_torch, torch_device

    try:
        require_torch()
        return torch_device(resolve_backend(config.backend).platform)
    except (TorchUnavailable, RuntimeError) as err:
        notes.append(str(err))
        return None


def run_sweep(
    config: SweepConfig,
    *,
    jax_runner: Callable | None = None,
    torch_runner: Callable | None = None,
    log: Callable[[str], None] | None = None,
) -> BenchResults:
    """Run every configuration of ``config``; returns all rows (ok, oom and error).

    ``jax_runner(case)``/``torch_runner(case, device)`` build the runners (defaults:
    ``JaxRunner``/``TorchRunner``); tests pass fakes.
    """
    config = validate(config)
    notes: list[str] = []
    device = _torch_device(config, notes)
    for note in notes:
        if log is not None:
            log(f"note: {note}")
    if jax_runner is None:
        from layoutlab.bench.jax_runner import JaxRunner

        jax_runner = lambda case: JaxRunner(
            case, backend=config.backend, conv_tune_repeats=config.conv_tune_repeats, log=log
        )
    if torch_runner is None and device is not None:
        from layoutlab.bench.torch_runner import TorchRunner

        torch_runner = lambda case, dev: TorchRunner(case, device=dev)
    machine = machine_info(config.backend, note=config.note)
    rows, history = [], []
    for jax_cases, torch_cases in _groups(config, device):
        runners = _interleave(
            [jax_runner(c) for c in jax_cases], [torch_runner(c, device) for c in torch_cases]
        )
        if config.max_step_s is not None:
            keep = []
            for r in runners:
                guess = _predicted_step_s(r.row(), history)
                if guess is not None and guess[0] > config.max_step_s:
                    rows.append(_skip_row(r, guess[0], guess[1], config.max_step_s))
                    if log is not None:
                        log(_describe(rows[-1]))
                else:
                    keep.append(r)
            runners = keep
        observed: dict = {}
        rows.extend(
            run_group(
                runners,
                repeats=config.repeats,
                warmup=config.warmup,
                log=log,
                max_step_s=config.max_step_s,
                observed=observed,
            )
        )
        history.extend((r.row(), seconds) for r, seconds in observed.items())
    machine = finish_machine_info(machine)
    machine["sweep"] = _config_dict(config)
    return BenchResults(machine, add_torch_ratios(rows), notes)


def _config_dict(config: SweepConfig) -> dict:
    out = dataclasses.asdict(config)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}
