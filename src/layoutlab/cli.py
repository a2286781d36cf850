"""The ``layoutlab`` command: a thin shell over the packages' own ``command`` modules."""

from __future__ import annotations

import argparse
import importlib
import sys

# Each module exposes ``register(subparsers)``; the order is the order of ``--help``.
COMMANDS = (
    "layoutlab.train.command",
    "layoutlab.models.command",
    "layoutlab.data.command",
    "layoutlab.xla.command",
    "layoutlab.compare.command",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="layoutlab",
        description="Layout- and precision-aware Flax vision models on XLA.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
