"""``layoutlab models``: list the registry."""

from __future__ import annotations

import argparse
import json

from layoutlab.models import registry


def _run(args: argparse.Namespace) -> int:
    rows = [
        {
            "name": name,
            "task": registry.spec(name).task,
            "dims": f"{registry.spec(name).num_spatial}D",
            "default_input": "x".join(map(str, registry.spec(name).default_input)),
            "description": registry.spec(name).description,
        }
        for name in registry.names()
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
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_run)
