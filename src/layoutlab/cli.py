"""The ``layoutlab`` command: a thin shell over the packages' own ``command`` modules."""

from __future__ import annotations

import argparse
import importlib
import sys

from layoutlab import __version__
from layoutlab.arguments import OneLineParser

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
    parser = OneLineParser(
        prog="layoutlab",
        description="Layout- and precision-aware Flax vision models on XLA.",
    )
    parser.add_argument("--version", action="version", version=f"layoutlab {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(subparsers)
    # Defined here, beside main(), which applies it before any command starts JAX.
    for name in KEEP_HOST_MEMORY_COMMANDS:
        _subparser(subparsers, name).add_argument(
            "--keep-host-memory",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="keep freed host memory in the process (on by default; glibc malloc "
            "settings, see layoutlab.xla.keep_host_memory): XLA:CPU stops page-faulting its "
            "temp buffer on every call; process-wide, so PyTorch in the same process gets it "
            "too. --no-keep-host-memory leaves glibc's defaults",
        )
    _name_parsers(parser)
    return parser


def _name_parsers(parser: argparse.ArgumentParser) -> None:
    """Each (sub)command's parser as its ``command_parser`` default: the innermost one wins,
    so an unknown flag is reported with the --help of the command it was given to."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.set_defaults(command_parser=sub)
                _name_parsers(sub)


def _autotune_train(args: argparse.Namespace) -> None:
    """``train --autotune``: bench/ sits above train/ in the import map, so it is joined here."""
    from layoutlab.bench.tuning import autotune_config
    from layoutlab.train.agreement import decided_by_process_0
    from layoutlab.train.command import build_config
    from layoutlab.train.config import load_run_data
    from layoutlab.train.distributed import main_process

    config, _ = build_config(args)  # on every process: it may agree on the workdir's name

    def decide():  # measured once, by process 0 of a multi-process run
        dataset = load_run_data(config)
        return autotune_config(
            config.model,
            config.batch_size,
            dataset.image_shape,
            model_kwargs=dict(config.model_kwargs),
            num_classes=dataset.num_classes,
        )

    args.layout, args.precision = decided_by_process_0("autotune", decide)
    if main_process():
        print(f"autotune chose layout {args.layout}, precision {args.precision}")


# Conv autotuning before training measures each candidate this many interleaved rounds: a
# cache-once tune, and the fewest rounds that give a 95% interval of the paired ratio, which
# a candidate must clear to replace XLA's conv (bench.stats.decide).
_CONV_TUNE_REPEATS = 6
_CONV_TUNE_WARMUP = 1


def _conv_planner(args: argparse.Namespace):
    """``train`` with ``"auto"`` convs (the default) and no ``conv_plan`` in its config: the
    loop asks this for the plan once it has built the model (bench/ sits above train/, so
    the tuning is joined here): the autotune cache, a tuning when it pays (``--conv-tune``)
    or the shipped table. The plan is stored in config.json and the checkpoints, so a
    resumed run keeps its algorithms."""

    def plan(model, images, steps: int, compiler_options: dict):
        from layoutlab.bench.tuning.plan_source import conv_plan_for_run

        found = conv_plan_for_run(
            model,
            images,
            steps=steps,
            tune=args.conv_tune,
            compiler_options=compiler_options or None,
            repeats=_CONV_TUNE_REPEATS,
            warmup=_CONV_TUNE_WARMUP,
        )
        print(f"conv plan: {found.detail}")  # once, even with --quiet; stderr is for errors
        return found.plan

    return plan


def _keep_host_memory(asked: bool) -> int | None:
    """Keep host memory before anything starts JAX's backend (see keep_host_memory): the
    default of the commands that run steps over and over. Only an explicit
    ``--keep-host-memory`` that comes too late (JAX already started in this process, as
    when ``main`` is called from Python) is an error; the default then changes nothing."""
    from layoutlab.xla.host_memory import HostMemoryError, keep_host_memory

    try:
        state = keep_host_memory()
    except HostMemoryError as e:
        if not asked:
            return None
        print(f"error: {e}", file=sys.stderr)
        return 2
    if asked and not state.kept:
        print(f"note: --keep-host-memory changes nothing here: {state.how}", file=sys.stderr)
    return None


# Image sizes of the data sets whose size the spec fixes (no loader is imported to know).
_DATA_PIXELS = {"digits": 64, "mnist": 784, "fashion_mnist": 784, "cifar10": 1024, "cifar100": 1024}
# Below this many input pixels per batch the temp buffer is small, and one malloc arena for
# every thread measured slower: the built-in digits job (32 x 8 x 8 = 2,048 pixels per
# batch) took 15.1-16.1 s with it against 13.1-14.6 s without (three interleaved runs
# each). The ResNet-18 CIFAR step at batch 128 (131,072) gains about 0.5 s a step.
_HOST_MEMORY_MIN_PIXELS = 32 * 32 * 32


def _batch_pixels(args: argparse.Namespace) -> int | None:
    """Input pixels of the largest batch the command runs, when the flags say (else None)."""
    if args.command == "train":
        from layoutlab.train.config import TrainConfig

        if args.config or args.resume:
            return None
        d = TrainConfig()
        name, _, rest = (args.data or d.data).strip().partition(":")
        pixels = _DATA_PIXELS.get(name.lower())
        if name.lower() == "synthetic":
            size = rest.partition(":")[0].lower().split("x")
            pixels = int(size[0]) * int(size[1]) if len(size) >= 2 and rest else 32 * 32
        if args.image_size:
            from layoutlab.train.run_data import parse_image_size

            h, w = parse_image_size(str(args.image_size))
            pixels = h * w
        return None if pixels is None else pixels * int(args.batch_size or d.batch_size)
    if args.command == "bench" and args.image_size:
        h, w = (args.image_size * 2)[:2]  # N: N x N
        return max(args.batch_sizes) * h * w
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
    argv = legacy_argv(list(sys.argv[1:] if argv is None else argv))
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        getattr(args, "command_parser", parser).error(
            f"unrecognized arguments: {' '.join(unknown)}"
        )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if args.command == "train" and args.distributed:
        from layoutlab.train.supervise import supervise, supervised

        if not supervised():  # JAX's aborts become one line (see train.supervise)
            return supervise(argv)
    keep = getattr(args, "keep_host_memory", False)
    if keep is None:  # the default: on, unless the batches are known to be small
        try:
            pixels = _batch_pixels(args)
        except ValueError:  # a malformed flag: the command's own checks name it
            pixels = None
        keep = None if pixels is None or pixels >= _HOST_MEMORY_MIN_PIXELS else False
    if keep is not False and hasattr(args, "keep_host_memory"):
        if failed := _keep_host_memory(asked=keep is True):
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
            args.conv_planner = _conv_planner(args)
        except (ValueError, FileNotFoundError) as e:
            from layoutlab.train.liveness import stop_with

            return stop_with(str(e))  # the other processes of a distributed run stop too
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
