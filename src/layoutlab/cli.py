"""The ``layoutlab`` command: a thin shell over the packages' own ``command`` modules."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

# Each module exposes ``register(subparsers)``; the order is the order of ``--help``.
COMMANDS = (
    "layoutlab.train.command",
    "layoutlab.infer.command",
    "layoutlab.models.command",
    "layoutlab.data.command",
    "layoutlab.xla.command",
    "layoutlab.compare.command",
    "layoutlab.bench.command",
    "layoutlab.bench.tuning.command",
)

# The commands that run steps over and over, where a per-call temp buffer's page faults add up.
KEEP_HOST_MEMORY_COMMANDS = ("train", "bench", "autotune convs", "conv-autotune")


def _subparser(subparsers, path: str) -> argparse.ArgumentParser:
    """The parser of ``path`` (``"autotune convs"``: a subcommand's subcommand)."""
    names = path.split()
    parser = subparsers.choices[names[0]]
    for name in names[1:]:
        nested = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = nested.choices[name]
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="layoutlab",
        description="Layout- and precision-aware Flax vision models on XLA.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(subparsers)
    # Defined here, beside main(), which applies it before any command starts JAX.
    for name in KEEP_HOST_MEMORY_COMMANDS:
        _subparser(subparsers, name).add_argument(
            "--keep-host-memory",
            action="store_true",
            help="keep freed host memory in the process (glibc malloc settings, see "
            "layoutlab.xla.keep_host_memory): XLA:CPU stops page-faulting its temp buffer on "
            "every call; process-wide, so PyTorch in the same process gets it too",
        )
    return parser


def _autotune_train(args: argparse.Namespace) -> None:
    """``train --autotune``: bench/ sits above train/ in the import map, so it is joined here."""
    from layoutlab.bench.tuning import autotune_config
    from layoutlab.train.command import build_config
    from layoutlab.train.config import load_run_data

    config, _ = build_config(args)
    dataset = load_run_data(config)
    args.layout, args.precision = autotune_config(
        config.model,
        config.batch_size,
        dataset.image_shape,
        model_kwargs=dict(config.model_kwargs),
        num_classes=dataset.num_classes,
    )
    print(f"autotune chose layout {args.layout}, precision {args.precision}")


# Conv autotuning before training measures each candidate this many interleaved rounds: a
# cache-once tune, and the fewest rounds that give a 95% interval of the paired ratio, which
# a candidate must clear to replace XLA's conv (bench.stats.decide).
_CONV_TUNE_REPEATS = 6
_CONV_TUNE_WARMUP = 1


def _autotune_train_convs(args: argparse.Namespace) -> None:
    """``train --conv-algo auto``: tune every conv shape of the run's train step (cached on
    disk) into the run's ``conv_plan`` (so config.json and the checkpoints record it). A
    config that already holds a plan (``--resume`` of a tuned run, ``--set conv_plan=...``)
    is used as it is: a resumed run keeps the algorithms it started with."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from layoutlab import models
    from layoutlab.bench.tuning import autotune_model
    from layoutlab.nn.conv_algos import AUTO
    from layoutlab.train.command import build_config
    from layoutlab.train.config import load_run_data, validate
    from layoutlab.train.loop import build_model, check_xla_options

    config, _ = build_config(args)
    if config.conv_algorithm != AUTO:
        return
    if config.conv_plan is not None:
        plan = validate(config, jax.device_count()).conv_plan  # a bad plan: error: ... exit 2
        print(f"conv plan: {len(plan['convs'])} conv(s) from the run's config, not re-tuned")
        return
    config = validate(config, jax.device_count())
    # A rejected option would make every candidate fail to compile and cache "xla" for all.
    check_xla_options(config.xla_options)
    dataset = load_run_data(config)
    h, w, c = dataset.image_shape
    # The global batch: the plan's spec keys must be the shapes the jitted step traces.
    shape = models.resolve_layout(config.layout, 2).shape(config.batch_size, c, (h, w))
    # Abstract: the specs need shapes only, and an eager init compiles every initializer.
    model = nnx.eval_shape(lambda: build_model(config, dataset))
    tuning = autotune_model(
        model,
        jax.ShapeDtypeStruct(shape, jnp.float32),
        objective="train",
        compiler_options=config.xla_options or None,
        repeats=_CONV_TUNE_REPEATS,
        warmup=_CONV_TUNE_WARMUP,
    )
    print(f"conv autotune: {tuning.summary()}")
    args.set = [*args.set, "conv_plan=" + json.dumps(tuning.plan.to_dict(), separators=(",", ":"))]


def _keep_host_memory() -> int | None:
    """``--keep-host-memory``: before anything starts JAX's backend (see keep_host_memory)."""
    from layoutlab.xla.host_memory import HostMemoryError, keep_host_memory

    try:
        state = keep_host_memory()
    except HostMemoryError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not state.kept:
        print(f"note: --keep-host-memory changes nothing here: {state.how}", file=sys.stderr)
    return None


def _join_run(args: argparse.Namespace) -> int | None:
    """``train --distributed`` (or any of its launch flags): join before JAX starts."""
    from layoutlab.train.distributed import DistributedError, initialize_distributed

    launch = (args.coordinator, args.num_processes, args.process_id)
    if not args.distributed:
        if any(x is not None for x in launch):
            print("error: --coordinator, --num-processes and --process-id need --distributed.",
                  file=sys.stderr)  # fmt: skip
            return 2
        return None
    try:
        initialize_distributed(*launch, timeout_s=args.distributed_timeout)
    except DistributedError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return None


def _use_backend(name: str) -> int | None:
    """``train --backend``: the only platform JAX starts in this process (before any other)."""
    import jax

    try:
        jax.devices()
    except RuntimeError as e:
        reason = " ".join(str(e).split(". (set JAX_PLATFORMS")[0].split())
        hint = "install jax's CUDA build (pip install 'jax[cuda12]')" if name == "gpu" else ""
        print(
            f"error: --backend {name} is not available here ({reason}); "
            f"{hint + ', or ' if hint else ''}leave --backend out to use jax's default.",
            file=sys.stderr,
        )
        return 2
    return None


def main(argv: list[str] | None = None) -> int:
    from layoutlab.bench.tuning.command import legacy_argv

    parser = build_parser()
    args = parser.parse_args(legacy_argv(list(sys.argv[1:] if argv is None else argv)))
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if getattr(args, "keep_host_memory", False) and (failed := _keep_host_memory()):
        return failed
    if args.command == "train":
        if args.backend:  # before the distributed join, which picks collectives per platform
            import jax

            jax.config.update("jax_platforms", args.backend)
        if (failed := _join_run(args)) or (args.backend and (failed := _use_backend(args.backend))):
            return failed
    if args.command == "train":
        try:
            if args.autotune:
                _autotune_train(args)  # layout and precision first: the conv shapes follow
            _autotune_train_convs(args)
        except (ValueError, FileNotFoundError) as e:
            print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
            return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
