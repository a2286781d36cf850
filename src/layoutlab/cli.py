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
    "layoutlab.bench.command",
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


def _autotune_train(args: argparse.Namespace) -> None:
    """``train --autotune``: bench/ sits above train/ in the import map, so it is joined here."""
    from layoutlab.bench.autotune import autotune_config
    from layoutlab.data import get_dataset
    from layoutlab.train.command import build_config

    config, _ = build_config(args)
    dataset = get_dataset(config.data, seed=config.seed)
    args.layout, args.precision = autotune_config(
        config.model,
        config.batch_size,
        dataset.image_shape,
        model_kwargs=dict(config.model_kwargs),
        num_classes=dataset.num_classes,
    )
    print(f"autotune chose layout {args.layout}, precision {args.precision}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if args.command == "train" and args.autotune:
        try:
            _autotune_train(args)
        except (ValueError, FileNotFoundError) as e:
            print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
            return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
