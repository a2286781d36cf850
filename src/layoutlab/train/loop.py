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

import contextlib
import dataclasses
import functools
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax

from layoutlab.data import (
    Dataset,
    prefetch_to_device,
    train_batches,
)
from layoutlab.loss_scale import NoOpLossScale
from layoutlab.train import program as programs
from layoutlab.train.agreement import agree_on_run, decided_by_process_0, run_fingerprint
from layoutlab.train.best_run import BestKeeper, finish_run
from layoutlab.train.checkpoint import Checkpointer
from layoutlab.train.compiled_step import compile_train_step
from layoutlab.train.config import TrainConfig
from layoutlab.train.divergence import Divergence
from layoutlab.train.evaluation import (
    eval_split,
    evaluate,
    evaluate_with_ema,
    host_scalars,
    jit_eval_step,
    run_eval_batch,
)
from layoutlab.train.metrics import (
    CHECKPOINT_DIR,
    CONFIG_FILE,
    METRICS_FILE,
    RunningMean,
    append_record,
    read_records,
    truncate_records,
    write_json,
)
from layoutlab.train.progress import Progress, bar_postfix, format_record
from layoutlab.train.resume import restore_or_start
from layoutlab.train.run_checks import check_xla_options
from layoutlab.train.run_identity import new_run_id
from layoutlab.train.run_plan import (
    planned,
    replan_stale_eval_plan,
    report_plan_coverage,
)
from layoutlab.train.run_start import filesystem_errors, resolve_run
from layoutlab.train.sharding import (
    Shardings,
    assemble,
    local_rows,
    make_shardings,
    state_shardings,
)
from layoutlab.train.spec import InputSpec, RunSpec
from layoutlab.train.step_log import STEPS_FILE, StepLog
from layoutlab.train.step_schedule import StepSchedule, make_step_schedule
from layoutlab.train.workdir import WorkdirLock, make_workdir
from layoutlab.train.xla_compile import compile_with_options

__all__ = [
    "StepSchedule",
    "check_xla_options",
    "evaluate",
    "make_step_schedule",
    "train_and_evaluate",
]

PLOT_FILE = "metrics.png"
# Metrics are fetched from the device every this many micro-steps (each fetch syncs).
_FETCH_EVERY = 10
_METER_KEY = "train_meter"  # checkpoint extra: the running train metrics since the last eval


def _open_checkpoints(
    workdir: Path, config: TrainConfig, resume: bool
) -> tuple[Checkpointer, BestKeeper]:
    ckpt = Checkpointer(
        workdir / CHECKPOINT_DIR, max_to_keep=config.keep_checkpoints, run_id=config.run_id
    )
    if ckpt.steps() and not resume:
        ckpt.close()
        raise ValueError(
            f"{workdir} already holds checkpoints (latest step {ckpt.steps()[-1]}); pass "
            "resume=True (--resume) to continue that run, or choose a new workdir."
        )
    return ckpt, BestKeeper.open(config, workdir)


def _abstract(init, shardings):
    return jax.tree.map(
        lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
        jax.eval_shape(init),
        shardings,
    )


def train_and_evaluate(
    config: TrainConfig,
    workdir: str | Path,
    *,
    resume: bool = False,
    quiet: bool = False,
    conv_planner: Callable | None = None,
) -> dict:
    """Trains ``config`` with outputs in ``workdir``; returns the final metrics record.

    ``workdir`` receives ``config.json``, ``metrics.jsonl``, ``metrics.png`` and
    ``checkpoints/``, and is locked while the run writes it (``train.workdir``).
    ``resume=True`` continues from the newest checkpoint that restores (corrupt ones are
    moved to ``checkpoints/corrupt/`` with a warning), after checking that ``config`` changes
    nothing the run may not change (``train.resume``). A run of ``"auto"`` convs without
    a ``conv_plan`` takes ``conv_planner(model, images, steps, compiler_options)``'s plan
    (the CLI's: cached, tuned or the table's), or when that is None or absent the table's
    (``nn.conv_algos.default_plan``). Every config error is raised as a
    ``ValueError`` before anything is compiled; a filesystem error is raised as a
    ``WorkdirError`` (a ``ValueError``) naming the path and the fix.
    """
    workdir = Path(workdir)
    spec, dataset, schedule, model, weights = resolve_run(
        config, workdir, resume=resume, announce=not resume
    )
    with filesystem_errors(workdir):
        if spec.config.run_id is None:  # a new run, or one from before run ids
            spec = spec.with_record(run_id=decided_by_process_0("run id", new_run_id))
        make_workdir(workdir, create=not resume)
        main = jax.process_index() == 0
        with WorkdirLock(workdir) if main else contextlib.nullcontext():
            agree_on_run(lambda: run_fingerprint(spec, dataset, schedule, model), workdir)
            ckpt, keeper = _open_checkpoints(workdir, spec.config, resume)
            try:
                return _run(
                    spec, workdir, dataset, schedule, ckpt, resume, quiet, conv_planner, model,
                    weights, keeper,
                )  # fmt: skip
            finally:
                ckpt.close()
                keeper.close()


@dataclasses.dataclass(frozen=True)
class _Run:
    """What the loop reads besides the state: the run's fixed parts."""

    spec: RunSpec
    workdir: Path
    dataset: Dataset
    schedule: StepSchedule
    ckpt: Checkpointer
    shard: Shardings
    train_step: Callable
    eval_step: Callable
    progress: Progress
    main: bool  # process 0 writes the workdir files
    step_log: StepLog
    divergence: Divergence
    keeper: BestKeeper  # keep_best's checkpoint and early_stop's count


def _run(
    spec, workdir, dataset, schedule, ckpt, resume, quiet, conv_planner, model, weights, keeper
) -> dict:
    """The run of a resolved ``spec``; ``model``: its abstract model (``_check_dataset``);
    ``weights``: what a new run starts from (``train.init_weights.initial_values``)."""
    run_start = time.perf_counter()
    main = jax.process_index() == 0
    progress_log = (lambda m: None) if quiet else (lambda m: print(m, file=sys.stderr))
    shard = make_shardings(spec.data_parallel)
    inputs = InputSpec.of(dataset, spec.batch_size)
    steps = schedule.total_steps * schedule.accum_steps
    eval_batch = run_eval_batch(dataset, spec, shard.num_devices)
    with_plan = planned(spec, inputs, steps, shard.batch, conv_planner, model, eval_batch)
    # A plan made just now covers every conv of this model and batch: no coverage to report.
    report_coverage, spec = with_plan is spec, with_plan
    if resume:
        spec = replan_stale_eval_plan(spec, inputs, model, eval_batch)
    config = spec.config  # what the run records (config.json, checkpoints)
    # init(): run it under jit (eagerly every initializer op would compile on its own, dozens
    # of small compiles); jax.eval_shape(init) is the abstract state a checkpoint restores into.
    program = programs.build_program(spec, inputs)
    init = program.init
    state_sharding = state_shardings(jax.eval_shape(init), shard, config.param_sharding)
    if report_coverage:
        report_plan_coverage(spec, inputs, shard.batch, progress_log, model)
    state, start, meter = None, 0, RunningMean()
    if resume:
        abstract = _abstract(init, state_sharding)
        state, start, extra = restore_or_start(
            ckpt, abstract, schedule, workdir / METRICS_FILE, progress_log
        )
        meter = RunningMean.from_dict(extra.get(_METER_KEY))
        keeper.restore(extra)
        done = start >= schedule.total_steps or keeper.stops()
        records = read_records(workdir / METRICS_FILE) if done else []
        if records and records[-1]["step"] == start:  # finished: nothing to compile or redo
            if main:
                how = "raise --steps or --epochs" if start >= schedule.total_steps else (
                    f"{keeper.stop_reason()}; raise --early-stop")  # fmt: skip
                print(
                    f"note: {workdir} is complete at step {start} of {schedule.total_steps}; "
                    f"nothing to train ({how} to continue it).",
                    file=sys.stderr,
                )
                # A kill between the last checkpoint and the summary left none: written now.
                finish_run(workdir, spec.config, records[-1], schedule.total_steps, keeper)
            return records[-1]
    if state is None:
        # The run's xla_options apply to init too, except its fast-compile level.
        run_options = program.spec.compile_options("train")
        options = {**run_options, **programs.INIT_COMPILER_OPTIONS}
        # The init weights go in as arguments: as constants they would be compiled in.
        start_from = jax.jit(lambda w: init(weights=w), out_shardings=state_sharding)
        lowered = start_from.lower(weights or {})
        state = compile_with_options(lowered, run_options, options)(weights or {})
    if main:
        write_json(workdir / CONFIG_FILE, config.to_dict())
        truncate_records(workdir / METRICS_FILE, start)

    t0 = time.perf_counter()
    train_step = compile_train_step(program, state, shard, state_sharding)
    eval_step = jit_eval_step(program.eval_step, program.spec, shard)
    compile_s = time.perf_counter() - t0

    progress = Progress(schedule.total_steps, start, quiet)
    progress.write(
        f"Training {config.model} on {dataset.name} ({schedule.total_steps} steps, "
        f"{shard.num_devices} device(s), train step compiled in {compile_s:.1f}s); "
        f"outputs in {workdir}"
    )
    progress.write(f"schedule: {spec.optimizer.schedule_line}")
    step_log = StepLog.for_run(workdir, spec, schedule, start, enabled=main)
    scaled = not isinstance(spec.loss_scale, NoOpLossScale)
    divergence = Divergence(
        schedule.accum_steps, lambda: max(ckpt.steps(), default=None), loss_scaled=scaled
    )
    run = _Run(spec, workdir, dataset, schedule, ckpt, shard, train_step, eval_step, progress,
               main, step_log, divergence, keeper)  # fmt: skip
    try:
        state, record, trained = _loop(run, state, start, meter)
    finally:
        progress.close()
        step_log.close()
    if record is None:  # nothing left to train: report the final state as it is
        record = _eval_record(run, state, schedule.total_steps, final=True)
    if main:
        finish_run(workdir, config, record, schedule.total_steps, keeper, run_start, trained)
        # matplotlib takes about 1 s to import: only the process that plots pays it.
        from layoutlab.train.plot import plot_metrics

        plot_metrics(
            read_records(workdir / METRICS_FILE),
            workdir / PLOT_FILE,
            steps=read_records(workdir / STEPS_FILE),
            title=f"{config.model} on {config.data} ({config.precision}, {config.layout})",
        )
    return record


def _eval_record(run: _Run, state, step: int, final: bool = False) -> dict:
    """The eval record of ``state``: on the validation split when the run has one, and then,
    when ``final``, on the test split too (its one test evaluation)."""
    record = {"step": step, "epoch": run.schedule.epoch(step)}
    splits = [eval_split(run.dataset)]
    if final and splits[0] != "test":
        splits.append("test")
    for split in splits:
        record.update(
            evaluate_with_ema(run.eval_step, state, run.dataset, run.spec, run.shard, split)
        )
    record.update(host_scalars(state))
    return record


def _loop(run: _Run, state, start: int, meter: RunningMean):
    """Steps ``start + 1 .. total`` (fewer when ``early_stop`` stops the run); returns the
    final state, the last eval record and ``(images, seconds)`` trained.

    ``meter`` holds the train metrics since the last evaluation; every checkpoint carries it
    (``extra["train_meter"]``), so a resumed run's first record averages the same steps, in
    the same order, as the uninterrupted run's."""
    spec, schedule = run.spec, run.schedule
    accum = schedule.accum_steps
    batches = train_batches(
        run.dataset,
        spec.batch_size,
        layout=spec.config.layout,
        seed=spec.seed,
        start_step=start * accum,
        num_steps=(schedule.total_steps - start) * accum,
        rows=local_rows(run.shard.batch, spec.batch_size),
    )
    pending = []
    step, micro, record = start, start * accum, None
    run_start = interval_start = time.perf_counter()
    interval_images = 0
    trained = [0, 0.0]  # images and seconds of training, evaluations and saves left out

    def fetch():
        # One host transfer for many steps' metrics; the device keeps running ahead.
        fetched = jax.device_get(pending)
        pending.clear()
        run.step_log.add(fetched, micro)
        run.divergence.add(fetched, micro)  # before any record or checkpoint of these steps
        for m in fetched:
            meter.add({"loss": m["loss"], "accuracy": m["accuracy"]})
        return fetched[-1] if fetched else None

    put = functools.partial(assemble, run.shard.batch, batch=spec.batch_size)
    with prefetch_to_device(batches, put=put) as device_batches:
        for images, labels in device_batches:
            state, metrics = run.train_step(state, images, labels)
            pending.append(metrics)
            micro += 1
            interval_images += spec.batch_size
            if micro % accum:
                continue
            step += 1
            postfix = None
            if len(pending) >= _FETCH_EVERY:
                seconds = time.perf_counter() - interval_start
                postfix = bar_postfix(meter, fetch(), interval_images, seconds)
            run.progress.update(1, postfix)
            is_last = step == schedule.total_steps
            evaluating = step % schedule.eval_every == 0 or is_last
            stopping = False
            if evaluating:
                fetch()
                jax.block_until_ready(state)
                elapsed = time.perf_counter() - interval_start
                trained[0] += interval_images
                trained[1] += elapsed
                record = {
                    "step": step,
                    "train_loss": meter.mean("loss"),
                    "train_accuracy": meter.mean("accuracy"),
                    **_eval_record(run, state, step),
                    "images_per_sec": interval_images / elapsed if elapsed > 0 else math.nan,
                    "elapsed": time.perf_counter() - run_start,
                }
                run.divergence.check_eval(record)
                # Before the record and the step's checkpoint, which carries the best so far.
                stopping = run.keeper.evaluated(record, state, {"config": spec.config.to_dict()})
                if (is_last or stopping) and eval_split(run.dataset) != "test":
                    test = evaluate(run.eval_step, state, run.dataset, spec, run.shard, "test")
                    record.update(test)  # the run's one test evaluation
                if run.main:
                    append_record(run.workdir / METRICS_FILE, record)
                    run.step_log.add_eval(record)
                run.progress.write(format_record(record))
                if stopping and run.main:  # said even when quiet: the run ends before its steps
                    print(run.keeper.stop_reason(), flush=True)
                meter.reset()
            if step % schedule.checkpoint_every == 0 or is_last or stopping:
                saving = time.perf_counter()
                fetch()  # the meter then covers every step up to this one
                extra = {"config": spec.config.to_dict(), _METER_KEY: meter.to_dict()}
                run.ckpt.save(step, state, {**extra, **run.keeper.extra()})
                interval_start += time.perf_counter() - saving  # not training time
            if evaluating:
                interval_start, interval_images = time.perf_counter(), 0
            if stopping:
                break
    return state, record, tuple(trained)
