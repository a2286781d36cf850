"""``layoutlab data --data SOURCE``: load a data set and print what it holds."""

from __future__ import annotations

import argparse
import json
import sys

from layoutlab.arguments import add_deprecated_flag, add_image_size, add_json

__all__ = ["register", "run"]


def register(subparsers) -> None:
    from layoutlab.data.source_forms import SOURCE_FORMS

    parser = subparsers.add_parser(
        "data",
        help="load a data set and print its sizes, shape, classes and mean/std",
        description="Load a data set and summarize it. Data source forms: "
        + "; ".join(SOURCE_FORMS),
    )
    parser.add_argument(
        "--data", default="digits", metavar="SOURCE", help="data source (default: digits)"
    )
    add_deprecated_flag(parser, "--spec", "--data", dest="data")
    parser.add_argument("--seed", type=int, default=0, help="train/test split seed")
    parser.add_argument(
        "--test-fraction", type=float, default=0.2, help="test share for unsplit sources"
    )
    add_image_size(parser, "resize folder images to HxW (one number: square)")
    add_json(parser, "the summary")
    parser.set_defaults(func=run)


def _format(summary: dict) -> str:
    names = summary["class_names"]
    shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
    h, w, c = summary["image_shape"]
    lines = [
        f"data set     {summary['name']}",
        f"train/test   {summary['train_size']} / {summary['test_size']} images",
        f"image shape  {h}x{w}x{c} (HxWxC)",
        f"classes      {summary['num_classes']}" + (f" ({shown})" if names else ""),
        f"mean         {', '.join(f'{m:.4f}' for m in summary['mean'])} (pixels in [0, 1])",
        f"std          {', '.join(f'{s:.4f}' for s in summary['std'])}",
        f"train counts {summary['train_class_counts']}",
        f"test counts  {summary['test_class_counts']}",
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from layoutlab.data.errors import DataError
    from layoutlab.data.source import get_dataset

    try:
        size = (args.image_size * 2)[:2] if args.image_size else None  # N: N x N
        dataset = get_dataset(
            args.data, seed=args.seed, test_fraction=args.test_fraction, image_size=size
        )
    except (DataError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary = dataset.summary()
    print(json.dumps(summary, indent=2) if args.json else _format(summary))
    return 0
