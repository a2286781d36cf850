"""``layoutlab train``: train a registered model on a data set, with checkpoints and metrics."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path

from layoutlab.arguments import OneLineParser, add_conv_tune, parse_image_size
from layoutlab.train import interrupt
from layoutlab.train.augment_flags import AUGMENT_FLAGS, add_augment_flags
from layoutlab.train.config import TrainConfig, apply_overrides, field_names
from layoutlab.train.config_file import read_config_file
from layoutlab.train.interrupt import sigterm_interrupts
from layoutlab.train.liveness import leave, recorded_failure, report_failure, stop_with
from layoutlab.train.recipe_flags import RECIPE_FLAGS, add_recipe_flags
from layoutlab.train.run_flags import add_run_flags, run_config

__all__ = ["register", "run", "main"]

# train's own flags -> TrainConfig field (the run flags are train.run_flags'); every flag
# defaults to None so only given ones override.
_FLAGS = {
    "data": "data",
    "loss_scale": "loss_scale",
    "epochs": "epochs",
    "steps": "num_steps",
    "accum_steps": "accum_steps",
    "lr": "learning_rate",
    "optimizer": "optimizer",
    "seed": "seed",
    "image_size": "image_size",
    "log_every": "log_every",
    "param_sharding": "param_sharding",
    **RECIPE_FLAGS,
    **AUGMENT_FLAGS,
}


def _add_arguments(p: argparse.ArgumentParser) -> None:
    d = TrainConfig()
    p.add_argument(
        "--config",
        metavar="FILE",
        help="a .json/.yaml mapping of config fields (an earlier run's config.json works); "
        "the flags and --set below apply on top of it",
    )
    add_run_flags(
        p,
        notes={
            "batch_size": "per micro-batch",
            "model_arg": "the same as --set model_kwargs.NAME=VALUE",
            "conv_algo": "auto: each conv shape runs its plan entry, from the autotune cache, a "
            "tuning when it pays (--conv-tune) or the shipped table (the plan is stored in "
            "config.json and kept by --resume); xla: XLA's own conv everywhere",
            "xla_option": "the train, eval and init programs get them",
        },
    )
    p.add_argument(
        "--data",
        metavar="SOURCE",
        help="data source: digits | cifar10:DIR | cifar100:DIR | mnist:DIR | fashion_mnist:DIR"
        f" | folder:DIR | synthetic[:HxWxC[:CLASSES[:N]]] (default {d.data})",
    )
    p.add_argument(
        "--loss-scale",
        metavar="SCALE",
        help="loss-scale name: none | static:S | dynamic (default: dynamic for float16 "
        "compute, else none)",
    )
    p.add_argument(
        "--image-size",
        metavar="N|HxW|H,W",
        type=lambda text: ",".join(map(str, parse_image_size(text))),
        help="folder data: resize every image to HxW (one number: square); default: the "
        "images' own size",
    )
    p.add_argument(
        "--log-every",
        metavar="N",
        help=f"write the train loss of every N-th step to steps.jsonl and TensorBoard "
        f"(default {d.log_every}; 0: none; --set tensorboard=false: no event files)",
    )
    p.add_argument("--epochs", help=f"passes over the train split (default {d.epochs})")
    p.add_argument("--steps", help="optimizer steps; overrides --epochs")
    p.add_argument("--accum-steps", help="micro-batches per optimizer step (default 1)")
    p.add_argument("--lr", help=f"peak learning rate (default {d.learning_rate})")
    p.add_argument("--optimizer", help=f"sgd | momentum | adam | adamw (default {d.optimizer})")
    p.add_argument("--remat", action="store_true", default=None, help="recompute block activations")
    p.add_argument("--seed", help=f"seed of init, shuffling and dropout (default {d.seed})")
    p.add_argument("--workdir", help="output directory (default ./runs/<model>-<YYYYmmdd-HHMMSS>)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest checkpoint in --workdir, with its config.json",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar or per-eval lines")
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config (what config.json would record, as JSON that --config "
        "reads) and exit: nothing is trained, compiled or written; conv_plan and "
        "eval_conv_plan stay as given (null: decided when the run starts)",
    )
    p.add_argument(
        "--backend",
        choices=("cpu", "gpu"),
        help="the only platform this process starts (default: jax's choice, a GPU if present)",
    )
    p.add_argument(
        "--autotune",
        action="store_true",
        help="pick layout and precision by measuring them for this model, batch and input "
        "shape (cached per shape; see `layoutlab autotune`); overrides --layout/--precision",
    )
    add_conv_tune(p, "the run")
    add_recipe_flags(p, d)
    add_augment_flags(p)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help=f"any config field ({', '.join(field_names())}; model_kwargs.NAME=VALUE, "
        "xla_options.NAME=VALUE)",
    )


def _add_distributed_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "more than one process (jax.distributed; see docs/guides/multihost.md)"
    )
    g.add_argument(
        "--distributed",
        action="store_true",
        help="join a multi-process run: JAX detects SLURM, Open MPI, GKE or Cloud TPU, or "
        "give --coordinator, --num-processes and --process-id",
    )
    g.add_argument("--coordinator", metavar="HOST:PORT", help="process 0's address and port")
    g.add_argument("--num-processes", type=int, metavar="N", help="processes in the run")
    g.add_argument("--process-id", type=int, metavar="I", help="this process, 0..N-1")
    g.add_argument(
        "--param-sharding",
        choices=("replicated", "fsdp"),
        help="replicated (default): every device holds the whole train state; fsdp: "
        "parameters and optimizer state split over the devices (about 1/N each)",
    )
    g.add_argument(
        "--distributed-timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="seconds to wait for the coordinator and every process (default 120)",
    )


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a model (default: small_cnn on the built-in digits)",
        description="Train a registered model with checkpoints, metrics and a plot. "
        "Outputs: config.json, metrics.jsonl, metrics.png and checkpoints/ in --workdir.",
    )
    _add_arguments(p)
    _add_distributed_arguments(p)
    p.set_defaults(func=run)


# XLA options that name files or directories to write (dumps, autotune results, caches):
# taken from the command line only, never from a saved config (anyone who can write the
# run's config.json could otherwise make a resume write wherever its user may).
_FILE_OPTION_PARTS = ("dump",)
_FILE_OPTION_ENDS = ("_to", "_dir", "_directory", "_path", "_file", "_prefix")


def writes_files(option: str) -> bool:
    """Whether XLA option ``option`` names a place to write files."""
    name = option.lower()
    return any(p in name for p in _FILE_OPTION_PARTS) or name.endswith(_FILE_OPTION_ENDS)


def _without_file_options(config: TrainConfig, source: str) -> TrainConfig:
    dropped = {k: v for k, v in config.xla_options.items() if writes_files(k)}
    if not dropped:
        return config
    given = ", ".join(f"{k}={v}" for k, v in dropped.items())
    print(
        f"note: not using xla_options {given} from {source}: options that write files are "
        "taken from the command line only (--xla-option NAME=VALUE).",
        file=sys.stderr,
    )
    kept = {k: v for k, v in config.xla_options.items() if k not in dropped}
    return dataclasses.replace(config, xla_options=kept)


def _saved_config(workdir: Path) -> TrainConfig:
    """The run's config for ``--resume``: its ``config.json`` (where you may edit what may
    change), else its newest readable checkpoint's; an error if it has neither. XLA options
    that write files (``writes_files``) are left out of it."""
    from layoutlab.train.loop import CHECKPOINT_DIR
    from layoutlab.train.resume import nothing_to_resume, saved_run_config

    found = saved_run_config(workdir, workdir / CHECKPOINT_DIR, prefer_config_json=True)
    if found is None:
        raise nothing_to_resume(workdir)
    saved, source = found
    try:
        config = TrainConfig.from_dict(saved)
    except ValueError as e:
        raise ValueError(f"The saved config in {source} is not usable: {e}") from None
    return _without_file_options(config, source)


def build_config(args: argparse.Namespace) -> tuple[TrainConfig, Path]:
    """``config_from_flags(args)`` and the run's workdir (``--workdir``, else one named after
    the model and process 0's clock, so every process names the same one); returned, never
    written into ``args``."""
    config = config_from_flags(args)
    workdir = args.workdir
    if not workdir:
        from layoutlab.train.distributed import agree_on, wall_clock

        # Every process takes process 0's clock, so all of them name the same directory.
        now = time.localtime(agree_on(wall_clock()))
        workdir = f"runs/{config.model}-{time.strftime('%Y%m%d-%H%M%S', now)}"
    return config, Path(workdir)


def config_from_flags(args: argparse.Namespace) -> TrainConfig:
    """The config from defaults (or the workdir's config.json on --resume), then the fields
    of ``--config FILE``, then the flags and ``--set`` (last wins); reads files only."""
    if args.resume and not args.workdir:
        raise ValueError("--resume needs --workdir DIR (the run to continue).")
    config = TrainConfig()
    if args.resume:
        config = _saved_config(Path(args.workdir))
    if args.config:
        config = read_config_file(args.config, config)
    overrides = [
        f"{field}={getattr(args, flag)}"
        for flag, field in _FLAGS.items()
        if getattr(args, flag) is not None
    ]
    if args.remat:
        overrides.append("remat=true")
    if args.freeze_backbone:
        overrides.append("freeze_backbone=true")
    for name in ("conv_plan", "eval_conv_plan"):
        if args.resume and any(item.partition("=")[0].strip() == name for item in args.set):
            # None is also "not given" in a TrainConfig, so only here can the ask be told apart.
            raise ValueError(
                f"--set {name} cannot be used with --resume: a run keeps the conv plans it was "
                "trained with (its config.json); drop it, or start a new workdir."
            )
    return run_config(args, config, overrides + list(args.set))


def _with_choice(config: TrainConfig, choice: tuple[str, str], sets: list[str]) -> TrainConfig:
    """``config`` with ``--autotune``'s ``(layout, precision)`` in place of the flags' (a
    ``--set`` of either still has the last word, as it has over every flag)."""
    layout, precision = choice
    kept = [s for s in sets if s.partition("=")[0].strip() in ("layout", "precision")]
    return apply_overrides(config, [f"layout={layout}", f"precision={precision}", *kept])


# How long a process whose collective failed waits for another process's named failure.
_CAUSE_WAIT_S = 3.0


def run(
    args: argparse.Namespace,
    *,
    autotune: Callable[[TrainConfig], tuple[str, str]] | None = None,
    conv_planner: Callable[[str], Callable] | None = None,
) -> int:
    """``layoutlab train``. ``autotune(config) -> (layout, precision)``: what ``--autotune``
    measures; ``conv_planner(conv_tune)``: the planner of ``"auto"`` convs that
    ``train_and_evaluate`` takes (both live in ``bench/``, above ``train/`` in the repository
    map, so the ``layoutlab`` command passes them in; None: no tuning)."""
    start = time.perf_counter()
    with sigterm_interrupts():
        return _run(args, start, autotune, conv_planner)


def _run(args: argparse.Namespace, start: float, autotune, conv_planner) -> int:
    from layoutlab.train.loop import train_and_evaluate

    try:
        if args.print_config:
            from layoutlab.train.config_preview import print_config

            return print_config(args, config_from_flags(args))
        config, workdir = build_config(args)
        if args.autotune:
            if autotune is None:
                raise ValueError("--autotune needs the `layoutlab` command (it tunes in bench/).")
            # layout and precision first: the conv shapes follow
            config = _with_choice(config, autotune(config), args.set)
        planner = None if conv_planner is None else conv_planner(args.conv_tune)
        from layoutlab.train.distributed import main_process

        main = main_process()  # the other processes of a distributed run print only errors
        quiet = args.quiet or not main
        record = train_and_evaluate(
            config, workdir, resume=args.resume, quiet=quiet, conv_planner=planner
        )
    except (ValueError, FileNotFoundError) as e:
        return stop_with(str(e))  # the other processes of a distributed run stop with it
    except RuntimeError as e:  # a collective across processes failed (another one stopped?)
        import jax

        if jax.process_count() == 1:
            raise
        # A process that died breaks the collective at once, its closed link names it a
        # moment later: the named cause is the one line worth printing.
        if (cause := recorded_failure(_CAUSE_WAIT_S)) is not None:
            return stop_with(f"the distributed run stopped: {cause}")
        return stop_with(
            f"a computation across the processes failed ({type(e).__name__}: "
            f"{' '.join(str(e).split())[:300]}); the first error of the other processes "
            "names the cause."
        )
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (train.interrupt)
        print(interrupt.MESSAGE, file=sys.stderr, flush=True)
        if not args.distributed:
            return interrupt.exit_code(e)
        report_failure(interrupt.MESSAGE)  # the other processes stop too, saying why
        return leave(interrupt.exit_code(e))
    if not main:
        return 0
    print(
        f"step {record['step']}: test_accuracy {record['test_accuracy']:.4f} "
        f"test_loss {record['test_loss']:.4f} ({time.perf_counter() - start:.1f}s)"
    )
    print(f"outputs in {workdir}: {_outputs(workdir)} (resume with --workdir {workdir} --resume)")
    return 0


def _outputs(workdir: Path) -> str:
    """The run's outputs that are in ``workdir``: ``steps.jsonl`` only with ``log_every``,
    ``tensorboard/`` only with TensorBoard on (or from an earlier part of the run)."""
    from layoutlab.train.best import BEST_DIR
    from layoutlab.train.loop import CHECKPOINT_DIR, PLOT_FILE
    from layoutlab.train.metrics import CONFIG_FILE, METRICS_FILE
    from layoutlab.train.step_log import STEPS_FILE, TENSORBOARD_DIR
    from layoutlab.train.summary import SUMMARY_FILE

    files = [CONFIG_FILE, METRICS_FILE, STEPS_FILE, PLOT_FILE, SUMMARY_FILE]
    dirs = [TENSORBOARD_DIR, CHECKPOINT_DIR, BEST_DIR]
    found = [f for f in files if (workdir / f).is_file()]
    return ", ".join(found + [f"{d}/" for d in dirs if (workdir / d).is_dir()])


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry: ``python -m layoutlab.train.command train ...``."""
    parser = OneLineParser(prog="layoutlab")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
