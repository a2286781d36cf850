"""``train_and_evaluate``: the training loop with evaluation, checkpoints and metrics.

Steps. The train state counts *micro-steps* (one batch each); with ``accum_steps=k`` an
optimizer step is ``k`` micro-steps (``optax.MultiSteps``). ``step`` in metrics, checkpoints,
``num_steps``, ``eval_every`` and ``checkpoint_every`` count optimizer steps.

Resuming. Everything a step reads is in the ``TrainState`` (params, batch statistics, the
dropout RNG key and counter, optimizer and loss-scale state, step), the batch of micro-step
``s`` is a function of ``(seed, s)`` (``data.train_batches``) and the augmentation key is
``fold_in(fold_in(key(0), s), seed)``. So a run restored from a checkpoint continues exactly
as the uninterrupted run would have, bit for bit on a deterministic backend.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx
from tqdm.auto import tqdm

from layoutlab import models
from layoutlab.data import (
    Dataset,
    augment,
    epoch_batches,
    get_dataset,
    prefetch_to_device,
    steps_per_epoch,
    train_batches,
)
from layoutlab.layout import parse_layout
from layoutlab.loss_scale import get_loss_scale
from layoutlab.nn.conv_algos import AUTO
from layoutlab.nn.conv_config import configure_convs, plan_coverage, with_conv_plan
from layoutlab.train.checkpoint import Checkpointer
from layoutlab.train.config import TrainConfig, builder_options, validate
from layoutlab.train.metrics import (
    CONFIG_FILE,
    METRICS_FILE,
    RunningMean,
    append_record,
    read_records,
    truncate_records,
    write_json,
)
from layoutlab.train.optim import make_optimizer
from layoutlab.train.plot import plot_metrics
from layoutlab.train.sharding import Shardings, make_shardings
from layoutlab.train.skip import skipped_steps
from layoutlab.train.state import TrainState, create_train_state, split_model
from layoutlab.train.steps import make_eval_step, make_train_step

__all__ = [
    "Plan",
    "build_model",
    "check_xla_options",
    "evaluate",
    "make_plan",
    "train_and_evaluate",
]

PLOT_FILE = "metrics.png"
CHECKPOINT_DIR = "checkpoints"
_INIT_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}
# Metrics are fetched from the device every this many micro-steps (each fetch syncs).
_FETCH_EVERY = 10


@dataclasses.dataclass(frozen=True)
class Plan:
    """Step counts of a run, all in optimizer steps except ``steps_per_epoch`` (batches)."""

    steps_per_epoch: int
    total_steps: int
    eval_every: int
    checkpoint_every: int
    accum_steps: int

    def epoch(self, step: int) -> float:
        return round(step * self.accum_steps / self.steps_per_epoch, 3)


def make_plan(config: TrainConfig, dataset: Dataset) -> Plan:
    n_train = dataset.split("train")[0].shape[0]
    if config.batch_size > n_train:
        raise ValueError(
            f"batch_size={config.batch_size} is larger than the {n_train} training examples "
            f"of {dataset.name}; use a batch_size <= {n_train}."
        )
    spe = steps_per_epoch(dataset, "train", config.batch_size)
    per_epoch = spe // config.accum_steps
    if config.num_steps is not None:
        total = config.num_steps
    else:
        total = config.epochs * spe // config.accum_steps
        if total < 1:
            raise ValueError(
                f"epochs={config.epochs} of {spe} batches give no optimizer step with "
                f"accum_steps={config.accum_steps}; raise epochs or lower accum_steps."
            )
    eval_every = config.eval_every or max(1, per_epoch)
    return Plan(
        steps_per_epoch=spe,
        total_steps=total,
        eval_every=eval_every,
        checkpoint_every=config.checkpoint_every or eval_every,
        accum_steps=config.accum_steps,
    )


def _check_dataset(config: TrainConfig, dataset: Dataset) -> None:
    channels = config.model_kwargs.get("in_channels")
    if channels is not None and channels != dataset.num_channels:
        raise ValueError(
            f"model_kwargs.in_channels={channels} but {config.data!r} has "
            f"{dataset.num_channels} channels; drop in_channels (it is set from the data)."
        )


def build_model(config: TrainConfig, dataset: Dataset) -> nnx.Module:
    """The configured model for ``dataset``'s classes and channels, seeded by ``config.seed``,
    with the run's conv algorithm and kernel storage, and for ``"auto"`` its ``conv_plan``.

    The kernels are initialized in the layout's order and then moved to ``kernel_storage``,
    so both storages start from the same weights. Under ``jax.jit``/``eval_shape`` the move
    is traced with the rest of the init: the state (and a checkpoint's abstract target) has
    the stored kernel shapes, HWIO for ``"channels_last"``.
    """
    kwargs = dict(config.model_kwargs)
    if "in_channels" in builder_options(config.model):
        kwargs.setdefault("in_channels", dataset.num_channels)
    if config.remat:
        kwargs["remat"] = True
    model = models.create(
        config.model,
        num_classes=dataset.num_classes,
        layout=config.layout,
        policy=config.precision,
        rngs=nnx.Rngs(config.seed),
        **kwargs,
    )
    model = configure_convs(model, config.conv_algorithm, config.kernel_storage)
    return with_conv_plan(model, config.conv_plan) if config.conv_algorithm == AUTO else model


def _xla_option_error(err: Exception, options: dict) -> ValueError | None:
    """A ``ValueError`` naming ``options`` when XLA rejected one of them, else None."""
    msg = str(err)
    if not options or ("No such compile option" not in msg and "While setting option" not in msg):
        return None
    first = msg.strip().splitlines()[0]
    return ValueError(
        f"XLA rejected xla_options {options}: {first} (fix or drop the option: "
        "--xla-option NAME=VALUE, or xla_options in config.json)"
    )


def _compile(lowered, options: dict, compiler_options: dict | None = None):
    """``lowered.compile(compiler_options)`` with a rejected XLA option turned into a
    ``ValueError`` naming the run's ``options`` instead of a runtime error."""
    try:
        return lowered.compile(compiler_options)
    except (jax.errors.JaxRuntimeError, ValueError) as err:
        clear = _xla_option_error(err, options)
        if clear is None:
            raise
        raise clear from None


def check_xla_options(options: dict) -> None:
    """Raise the ``ValueError`` of ``train_and_evaluate`` if XLA rejects ``options`` (a name
    it does not know, a value of the wrong type), by compiling a trivial program."""
    if options:
        lowered = jax.jit(lambda x: x + 1, compiler_options=options).lower(jnp.float32(0))
        _compile(lowered, options)


def _augment_fn(config: TrainConfig):
    if not config.augment:
        return None
    layout, seed = parse_layout(config.layout), config.seed

    def fn(key, images):
        return augment(jax.random.fold_in(key, seed), images, layout)

    return fn


def _batch_spec(config: TrainConfig, dataset: Dataset, batch: int, sharding):
    h, w, c = dataset.image_shape
    shape = (batch, h, w, c) if parse_layout(config.layout).is_channels_last else (batch, c, h, w)
    return (
        jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding),
        jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=sharding),
    )


def _compile_train_step(config, dataset, defs, tx, state, shard: Shardings):
    step = make_train_step(defs, tx, augment=_augment_fn(config))
    jitted = jax.jit(
        step,
        donate_argnums=0,
        out_shardings=(shard.replicated, shard.replicated),
        compiler_options=config.xla_options or None,
    )
    images, labels = _batch_spec(config, dataset, config.batch_size, shard.batch)
    return _compile(jitted.lower(state, images, labels), config.xla_options)


def _report_plan_coverage(config, dataset, shard: Shardings, log) -> None:
    """``"auto"`` convs without a ``conv_plan`` entry for their shape run XLA's native conv;
    say how many, and how to plan them (bench/ sits above train/, so not from here)."""
    if config.conv_algorithm != AUTO:
        return
    model = nnx.eval_shape(lambda: build_model(config, dataset))
    images, _ = _batch_spec(config, dataset, config.batch_size, shard.batch)
    missing, total = plan_coverage(model, images)
    if missing:
        log(
            f"conv_algorithm=auto: {missing} of {total} conv(s) have no conv_plan entry for "
            "their shape and run XLA's native conv; `layoutlab train --conv-algo auto` tunes "
            "them, as does layoutlab.bench.autotune.autotune_model(model, x) (its plan's "
            "to_dict() is the conv_plan)."
        )


def evaluate(eval_step, state, dataset: Dataset, config: TrainConfig, shard: Shardings) -> dict:
    """Loss and accuracy over the whole test split, the last partial batch included.

    Full batches are split over the devices; the remainder (any size) runs replicated, which
    costs one more compile of the eval step and keeps every example counted once.
    """
    total = None
    for images, labels in epoch_batches(
        dataset,
        "test",
        config.eval_batch_size,
        layout=config.layout,
        shuffle=False,
        drop_last=False,
    ):
        full = images.shape[0] == config.eval_batch_size
        sharding = shard.batch if full else shard.replicated
        out = jax.device_get(eval_step(state, *jax.device_put((images, labels), sharding)))
        total = out if total is None else {k: total[k] + out[k] for k in total}
    count = int(total["count"])
    return {
        "test_loss": float(total["loss_sum"]) / count,
        "test_accuracy": int(total["correct"]) / count,
    }


class _Progress:
    """The tqdm bar plus per-eval lines; silent when ``quiet``."""

    def __init__(self, total: int, initial: int, quiet: bool):
        self.quiet = quiet
        self.bar = tqdm(
            total=total,
            initial=initial,
            unit="step",
            dynamic_ncols=True,
            disable=quiet or not sys.stderr.isatty(),
            file=sys.stderr,
        )

    def update(self, n: int, postfix: dict | None) -> None:
        self.bar.update(n)
        if postfix is not None:
            self.bar.set_postfix(postfix, refresh=False)

    def write(self, line: str) -> None:
        if not self.quiet:
            tqdm.write(line, file=sys.stdout)

    def close(self) -> None:
        self.bar.close()


def _format_record(r: dict) -> str:
    return (
        f"step {r['step']} (epoch {r['epoch']:g}): train_loss {r['train_loss']:.4f} "
        f"test_loss {r['test_loss']:.4f} test_accuracy {r['test_accuracy']:.4f} "
        f"images/s {r['images_per_sec']:.0f} loss_scale {r['loss_scale']:g}"
    )


def _prepare_workdir(workdir: Path, config: TrainConfig, resume: bool) -> Checkpointer:
    workdir.mkdir(parents=True, exist_ok=True)
    ckpt = Checkpointer(workdir / CHECKPOINT_DIR, max_to_keep=config.keep_checkpoints)
    if ckpt.steps() and not resume:
        ckpt.close()
        raise ValueError(
            f"{workdir} already holds checkpoints (latest step {ckpt.steps()[-1]}); pass "
            "resume=True (--resume) to continue that run, or choose a new workdir."
        )
    return ckpt


def _make_init(config, dataset, plan):
    """``(defs, tx, init)``: ``init()`` builds the initial ``TrainState``; run it under jit.

    Building the model eagerly would compile every initializer op separately (dozens of small
    compiles); under ``jax.jit`` the whole init is one program, and ``jax.eval_shape(init)``
    gives the abstract state a checkpoint is restored into without running it at all.
    """
    tx = make_optimizer(config, plan.total_steps)
    loss_scale = get_loss_scale(config.loss_scale)
    defs, _, _ = split_model(nnx.eval_shape(lambda: build_model(config, dataset)))

    def init():
        return create_train_state(build_model(config, dataset), tx, loss_scale)[1]

    return defs, tx, init


def _abstract(init, sharding):
    return jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
        jax.eval_shape(init),
    )


def _check_saved_storage(ckpt: Checkpointer, config: TrainConfig) -> None:
    """Channels-first kernels are stored OIHW or HWIO: name a storage change on resume
    instead of a shape mismatch (or, for square kernels, silently transposed weights)."""
    steps = ckpt.steps()
    if not steps or parse_layout(config.layout).is_channels_last:
        return
    try:
        saved = ckpt.read_meta(steps[-1]).get("extra", {}).get("config", {})
    except Exception:  # an unreadable checkpoint is restore_latest's to report and skip
        return
    storage = saved.get("kernel_storage", "layout")
    if saved.get("layout") == config.layout and storage != config.kernel_storage:
        raise ValueError(
            f"{ckpt.step_dir(steps[-1])} holds conv kernels in kernel_storage={storage!r}, "
            f"this run has kernel_storage={config.kernel_storage!r}; resume with "
            f"--kernel-storage {storage} (the run's config.json has it)."
        )


def _restore(
    ckpt: Checkpointer, abstract, plan: Plan, config: TrainConfig, log
) -> tuple[TrainState | None, int]:
    _check_saved_storage(ckpt, config)
    found = ckpt.restore_latest(abstract)
    if found is None:
        log(f"No checkpoint under {ckpt.directory}; starting from step 0.")
        return None, 0
    state, step = found
    if int(state.step) != step * plan.accum_steps:
        raise ValueError(
            f"Checkpoint {ckpt.step_dir(step)} is at micro-step {int(state.step)}, expected "
            f"{step * plan.accum_steps} for accum_steps={plan.accum_steps}; resume with the "
            "accum_steps of the run that wrote it."
        )
    log(f"Resuming from {ckpt.step_dir(step)} (step {step}).")
    return state, step


def _host_scalars(state: TrainState) -> dict:
    return {
        "loss_scale": float(state.loss_scale.loss_scale),
        "skipped_steps": int(skipped_steps(state.opt_state)),
    }


def train_and_evaluate(
    config: TrainConfig, workdir: str | Path, *, resume: bool = False, quiet: bool = False
) -> dict:
    """Trains ``config`` with outputs in ``workdir``; returns the final metrics record.

    ``workdir`` receives ``config.json``, ``metrics.jsonl``, ``metrics.png`` and
    ``checkpoints/``. ``resume=True`` continues from the newest checkpoint that restores
    (corrupt ones are moved to ``checkpoints/corrupt/`` with a warning). Every config error
    is raised as a ``ValueError`` before anything is compiled.
    """
    config = validate(config, jax.device_count())
    workdir = Path(workdir)
    dataset = get_dataset(config.data)
    _check_dataset(config, dataset)
    plan = make_plan(config, dataset)
    ckpt = _prepare_workdir(workdir, config, resume)
    try:
        return _run(config, workdir, dataset, plan, ckpt, resume, quiet)
    finally:
        ckpt.close()


@dataclasses.dataclass(frozen=True)
class _Run:
    """What the loop reads besides the state: the run's fixed parts."""

    config: TrainConfig
    workdir: Path
    dataset: Dataset
    plan: Plan
    ckpt: Checkpointer
    shard: Shardings
    train_step: Callable
    eval_step: Callable
    progress: _Progress
    main: bool  # process 0 writes the workdir files


def _run(config, workdir, dataset, plan, ckpt, resume, quiet) -> dict:
    main = jax.process_index() == 0
    progress_log = (lambda m: None) if quiet else (lambda m: print(m, file=sys.stderr))
    shard = make_shardings(config.data_parallel)
    defs, tx, init = _make_init(config, dataset, plan)
    _report_plan_coverage(config, dataset, shard, progress_log)
    state, start = None, 0
    if resume:
        abstract = _abstract(init, shard.replicated)
        state, start = _restore(ckpt, abstract, plan, config, progress_log)
    if state is None:
        # init runs once: compiled without LLVM optimizations it compiles ~4x faster on CPU
        # (threefry is slow to optimize); float results may differ from an eager init by
        # an ulp (no FMA contraction), identically in every run.
        # The run's xla_options apply too, except that init keeps its fast-compile level.
        options = {**config.xla_options, **_INIT_COMPILER_OPTIONS}
        lowered = jax.jit(init, out_shardings=shard.replicated).lower()
        state = _compile(lowered, config.xla_options, options)()
    if main:
        write_json(workdir / CONFIG_FILE, config.to_dict())
        truncate_records(workdir / METRICS_FILE, start)

    t0 = time.perf_counter()
    train_step = _compile_train_step(config, dataset, defs, tx, state, shard)
    eval_step = jax.jit(
        make_eval_step(defs),
        out_shardings=shard.replicated,
        compiler_options=config.xla_options or None,
    )
    compile_s = time.perf_counter() - t0

    progress = _Progress(plan.total_steps, start, quiet)
    progress.write(
        f"Training {config.model} on {dataset.name} ({plan.total_steps} steps, "
        f"{shard.num_devices} device(s), train step compiled in {compile_s:.1f}s); "
        f"outputs in {workdir}"
    )
    run = _Run(config, workdir, dataset, plan, ckpt, shard, train_step, eval_step, progress, main)
    try:
        state, record = _loop(run, state, start)
    finally:
        progress.close()
    if record is None:  # nothing left to train: report the final state as it is
        record = _eval_record(run, state, plan.total_steps)
    if main:
        plot_metrics(
            read_records(workdir / METRICS_FILE),
            workdir / PLOT_FILE,
            title=f"{config.model} on {config.data} ({config.precision}, {config.layout})",
        )
    return record


def _eval_record(run: _Run, state, step: int) -> dict:
    record = {"step": step, "epoch": run.plan.epoch(step)}
    record.update(evaluate(run.eval_step, state, run.dataset, run.config, run.shard))
    record.update(_host_scalars(state))
    return record


def _postfix(meter: RunningMean, last: dict, images: int, seconds: float) -> dict:
    return {
        "loss": f"{meter.mean('loss'):.4f}",
        "acc": f"{meter.mean('accuracy'):.3f}",
        "img/s": f"{images / seconds:.0f}",
        "scale": f"{float(last['loss_scale']):g}",
    }


def _loop(run: _Run, state, start: int):
    """Steps ``start + 1 .. total``; returns the final state and the last eval record."""
    config, plan = run.config, run.plan
    accum = plan.accum_steps
    batches = train_batches(
        run.dataset,
        config.batch_size,
        layout=config.layout,
        seed=config.seed,
        start_step=start * accum,
        num_steps=(plan.total_steps - start) * accum,
    )
    meter, pending = RunningMean(), []
    step, micro, record = start, start * accum, None
    run_start = interval_start = time.perf_counter()
    interval_images = 0

    def fetch():
        # One host transfer for many steps' metrics; the device keeps running ahead.
        fetched = jax.device_get(pending)
        pending.clear()
        for m in fetched:
            meter.add({"loss": m["loss"], "accuracy": m["accuracy"]})
        return fetched[-1] if fetched else None

    with prefetch_to_device(batches, sharding=run.shard.batch) as device_batches:
        for images, labels in device_batches:
            state, metrics = run.train_step(state, images, labels)
            pending.append(metrics)
            micro += 1
            interval_images += config.batch_size
            if micro % accum:
                continue
            step += 1
            postfix = None
            if len(pending) >= _FETCH_EVERY:
                seconds = time.perf_counter() - interval_start
                postfix = _postfix(meter, fetch(), interval_images, seconds)
            run.progress.update(1, postfix)
            is_last = step == plan.total_steps
            evaluating = step % plan.eval_every == 0 or is_last
            if evaluating:
                fetch()
                jax.block_until_ready(state)
                elapsed = time.perf_counter() - interval_start
                record = {
                    "step": step,
                    "train_loss": meter.mean("loss"),
                    "train_accuracy": meter.mean("accuracy"),
                    **_eval_record(run, state, step),
                    "images_per_sec": interval_images / elapsed if elapsed > 0 else math.nan,
                    "elapsed": time.perf_counter() - run_start,
                }
                if run.main:
                    append_record(run.workdir / METRICS_FILE, record)
                run.progress.write(_format_record(record))
                meter.reset()
            if step % plan.checkpoint_every == 0 or is_last:
                saving = time.perf_counter()
                run.ckpt.save(step, state, {"config": config.to_dict()})
                interval_start += time.perf_counter() - saving  # not training time
            if evaluating:
                interval_start, interval_images = time.perf_counter(), 0
    return state, record
