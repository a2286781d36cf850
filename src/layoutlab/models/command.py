"""``layoutlab models``: list the registry."""

from __future__ import annotations

import argparse
import json

from layoutlab.arguments import add_json
from layoutlab.models.catalog import BUILTIN_MODELS

__all__ = ["register"]


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
    p = subparsers.add_parser(
        "models",
        help="list the registered models",
        description="List the registered models: name, spatial dimensions, task, default "
        "input (HxWxC) and a one-line description; --model of every command takes the name.",
    )
    add_json(p, "the models, instead of a table,")
    p.set_defaults(func=_run)
