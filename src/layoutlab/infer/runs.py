"""``layoutlab runs DIR``: the training runs under a directory, one row each, from their
``summary.json`` (``train.summary``) and ``config.json``.

Reads JSON only (no JAX): a run is a directory holding ``config.json``; its row says when it
has no summary (running, killed, or from before summaries) or an unreadable one, and the
listing goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from layoutlab.arguments import STDOUT, add_json

__all__ = ["find_runs", "format_table", "register", "run_rows"]

_CONFIG, _SUMMARY = "config.json", "summary.json"
_COLUMNS = ("run", "model", "data", "epochs", "best", "test_accuracy", "time", "status")


def find_runs(root: Path) -> list[Path]:
    """The run directories under ``root`` (``root`` itself included), sorted; a run's own
    sub-directories (checkpoints, ...) are not searched."""
    runs = []
    for here, dirs, files in os.walk(root):
        if _CONFIG in files:
            runs.append(Path(here))
            dirs.clear()
        dirs.sort()
    return sorted(runs)


def _read(path: Path) -> tuple[dict | None, str | None]:
    """``(object, None)`` of a JSON object file, or ``(None, why not)``."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None, "missing"
    except (OSError, ValueError) as e:
        return None, f"unreadable {path.name}: {type(e).__name__}"
    return (data, None) if isinstance(data, dict) else (None, f"{path.name} is not an object")


def _row(root: Path, run: Path) -> dict:
    config, _ = _read(run / _CONFIG)
    summary, why = _read(run / _SUMMARY)
    name = run.relative_to(root).as_posix() if run != root else run.name
    row = dict.fromkeys(_COLUMNS)
    row.update(run=name, model=(config or {}).get("model"), data=(config or {}).get("data"))
    if summary is None:
        row["status"] = "no summary.json (unfinished)" if why == "missing" else why
        return row
    try:
        best = summary.get("best") or None
        row.update(
            model=summary.get("model", row["model"]),
            data=summary.get("data", row["data"]),
            epochs=summary.get("epoch"),
            best=None if best is None else {k: best.get(k) for k in ("metric", "value", "step")},
            test_accuracy=(summary.get("test") or {}).get("test_accuracy"),
            time=summary.get("wall_time_s"),
            status=summary.get("stop_reason") or "done",
        )
    except AttributeError:  # a summary of another shape (a field that is not an object)
        row["status"] = "unreadable summary.json: unexpected contents"
    return row


def run_rows(root: str | Path) -> list[dict]:
    """One row per run under ``root`` (``_COLUMNS``), JSON-ready."""
    root = Path(root)
    return [_row(root, run) for run in find_runs(root)]


def _cell(column: str, value) -> str:
    if value is None:
        return "-"
    try:
        if column == "best":
            return f"{value['metric']} {value['value']:.4f} @{value['step']}"
        if column == "test_accuracy":
            return f"{value:.4f}"
        if column == "epochs":
            return f"{value:g}"
        if column == "time":
            minutes, seconds = divmod(float(value), 60)
            return f"{int(minutes)}m{seconds:04.1f}s" if minutes else f"{seconds:.1f}s"
    except (TypeError, ValueError, KeyError):
        return "?"
    return str(value)


def format_table(rows: list[dict]) -> str:
    cells = [list(_COLUMNS)] + [[_cell(c, r[c]) for c in _COLUMNS] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(_COLUMNS))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in cells
    )


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "runs",
        help="list the training runs under a directory: model, data, best metric, test accuracy",
        description="List the runs under DIR (each directory holding a config.json), one row "
        "per run from its summary.json: name, model, data, epochs, best metric (--keep-best), "
        "test accuracy, wall time and how it ended.",
    )
    p.add_argument("dir", metavar="DIR", help="a directory of runs (or one run's workdir)")
    add_json(p, "the rows")
    p.set_defaults(func=run_runs)


def run_runs(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    if not root.is_dir():
        print(f"error: {root} is not a directory; pass the directory of runs.", file=sys.stderr)
        return 2
    rows = run_rows(root)
    if args.json == STDOUT:
        print(json.dumps(rows, indent=1))
    elif not rows:
        print(f"no runs under {root} (no directory there holds a config.json)")
    else:
        print(format_table(rows))
    return 0
