"""``layoutlab models``: list the registry; and the model keyword arguments of the model
flags other commands share (``arguments.add_model_options``)."""

from __future__ import annotations

import argparse
import json

from layoutlab.arguments import add_json, parse_model_args
from layoutlab.models.catalog import BUILTIN_MODELS

__all__ = ["model_kwargs", "register"]


def model_kwargs(args: argparse.Namespace) -> dict:
    """The model keyword arguments of ``--tiny``, ``--stem`` and ``--model-arg`` (in that
    order, the last winning)."""
    from layoutlab import models

    kwargs = dict(models.spec(args.model).tiny) if args.tiny else {}
    if args.stem is not None:
        kwargs["stem"] = args.stem
    kwargs.update(parse_model_args(args.model_arg))
    return kwargs


def _run(args: argparse.Namespace) -> int:
    rows = [
        {
            "name": entry.name,
            "task": entry.task,
            "dims": f"{entry.num_spatial}D",
            "default_input": "x".join(map(str, entry.default_input)),
            "description": entry.description,
        }
        for entry in BUILTIN_MODELS
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        print(
            f"{r['name']:<{width}}  {r['dims']}  {r['task']:<14} {r['default_input']:<10} "
            f"{r['description']}"
        )
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("models", help="list the registered models")
    add_json(p, "the models, instead of a table,")
    p.set_defaults(func=_run)
