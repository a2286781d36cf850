"""The ``layoutlab`` command: a thin shell over the packages' own ``command`` modules."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from layoutlab.arguments import OneLineParser
from layoutlab.host.flag import (
    add_keep_host_memory,
    apply_keep_host_memory,
    huge_pages_wanted,
)
from layoutlab.version import __version__

__all__ = ["COMMANDS", "build_parser", "main"]


# Each module exposes ``register(subparsers)``; the order is the order of ``--help``.
COMMANDS = (
    "layoutlab.train.command",
    "layoutlab.infer.command",
    "layoutlab.infer.runs",
    "layoutlab.models.command",
    "layoutlab.data.command",
    "layoutlab.xla.command",
    "layoutlab.compare.command",
    "layoutlab.bench.command",
    "layoutlab.bench.tuning.command",
)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="layoutlab",
        description="Layout- and precision-aware Flax vision models on XLA.",
    )
    parser.add_argument(
        "--version", action=_Version, nargs=0, help="show the version and whether oneDNN runs"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(subparsers)
    # Spans commands of several packages; main() applies it before any command starts JAX.
    add_keep_host_memory(subparsers)
    _name_parsers(parser)
    return parser


class _Version(argparse.Action):
    """``layoutlab X`` and the onednn convs' status line, read only when asked for."""

    def __call__(self, parser, namespace, values, option_string=None):
        from layoutlab.nn.conv_algos.onednn_status import onednn_status

        print(f"layoutlab {__version__}\n{onednn_status().line}")
        parser.exit()


def _name_parsers(parser: argparse.ArgumentParser) -> None:
    """Each (sub)command's parser as its ``command_parser`` default: the innermost one wins,
    so an unknown flag is reported with the --help of the command it was given to."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.set_defaults(command_parser=sub)
                _name_parsers(sub)


def main(argv: list[str] | None = None) -> int:
    if argv is not None:
        return _main(argv)
    try:
        code = _main(None)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return code
    except BrokenPipeError:
        # The reader went away (`layoutlab evaluate ... | head`): stop quietly as other
        # command-line tools do, and keep the interpreter's final flush off the closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _main(argv: list[str] | None) -> int:
    from layoutlab.bench.tuning.command import legacy_argv
    from layoutlab.train import launch

    parser = build_parser()
    command_line = argv is None  # this process is the command, which may start again
    argv = legacy_argv(list(sys.argv[1:] if argv is None else argv))
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        getattr(args, "command_parser", parser).error(
            f"unrecognized arguments: {' '.join(unknown)}"
        )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if command_line and huge_pages_wanted(args):
        # glibc reads the tunable only at start: returns only where it changes nothing.
        from layoutlab.host.huge_pages import restart_with_huge_pages

        restart_with_huge_pages()
    train = args.command == "train"
    if train and (supervised := launch.supervise_distributed(args, argv)) is not None:
        return supervised
    if failed := apply_keep_host_memory(args):
        return failed
    if train:
        # bench/ sits above train/ in the repository map, so its tuning is joined here.
        from layoutlab.bench.tuning.train_run import autotune_train, conv_planner

        if failed := launch.start(args):
            return failed
        return int(args.func(args, autotune=autotune_train, conv_planner=conv_planner) or 0)
    if args.command == "bench":  # a sweep across the host-memory threshold reruns it per part
        return int(args.func(args, argv=argv) or 0)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
