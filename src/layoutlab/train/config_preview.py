"""``layoutlab train --print-config``: the resolved config of a run, shown before it runs.

The config goes through ``train.run_start.resolve_run``, the first part of every run: bad
input is refused with the very error ``train`` gives, and what is printed is the spec's
config that ``config.json`` records, its automatic fields filled in, as JSON that
``--config`` reads back. What a run decides only once it starts is left as it would be
before: ``run_id`` (null: made by the run) and ``conv_plan``/``eval_conv_plan`` (as given;
null: the autotune cache, a tuning or the shipped table decide them at the start). Nothing is
compiled, tuned or written.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from layoutlab.train.config import TrainConfig

__all__ = ["print_config", "resolved_config"]


def resolved_config(
    config: TrainConfig, workdir: str | Path | None = None, *, resume: bool = False
) -> TrainConfig:
    """``config`` as a run in ``workdir`` would record it (see the module docstring)."""
    from layoutlab.train.run_start import resolve_run

    workdir = None if workdir is None else Path(workdir)
    return resolve_run(config, workdir, resume=resume)[0].config


def print_config(args: argparse.Namespace, config: TrainConfig) -> int:
    """``train --print-config``: ``config`` (the flags') resolved, as JSON on stdout."""
    if args.autotune:
        raise ValueError(
            "--print-config cannot show what --autotune measures (it compiles and times the "
            "model); drop --autotune, or give --layout and --precision."
        )
    resolved = resolved_config(config, args.workdir, resume=args.resume)
    print(json.dumps(resolved.to_dict(), indent=1))
    return 0
