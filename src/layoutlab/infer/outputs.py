"""Where ``evaluate`` and ``export`` may write: anywhere but into the run they read.

A step's files are what certify it (``train.manifest``), so a file written into
``checkpoints/`` can de-certify a step, and one written over ``config.json`` or
``metrics.jsonl`` changes what a resume compares. Paths are compared after resolving links
and ``..``, since either can lead back into the run; the check comes before any work.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["check_outputs"]


def _run_paths(workdir: Path) -> tuple[dict[Path, str], dict[Path, str]]:
    """``(trees, files)`` of the run: the folders nothing may be written into, and the
    run's own files, each with its name in the message."""
    from layoutlab.train.best import BEST_DIR
    from layoutlab.train.loop import CHECKPOINT_DIR, PLOT_FILE
    from layoutlab.train.metrics import CONFIG_FILE, METRICS_FILE
    from layoutlab.train.step_log import STEPS_FILE, TENSORBOARD_DIR
    from layoutlab.train.summary import SUMMARY_FILE
    from layoutlab.train.workdir import LOCK_FILE

    root = workdir.resolve()
    trees = {root / d: f"{d}/" for d in (CHECKPOINT_DIR, BEST_DIR, TENSORBOARD_DIR)}
    names = (CONFIG_FILE, METRICS_FILE, STEPS_FILE, PLOT_FILE, LOCK_FILE, SUMMARY_FILE)
    return trees, {root / name: name for name in names}


def check_outputs(workdir: str | os.PathLike, outputs: dict[str, str | os.PathLike]) -> None:
    """Raises a one-line ``ValueError`` when an output (``{flag: path}``; None: not asked
    for) is inside the run's ``checkpoints/``, ``best/`` or ``tensorboard/`` or is one of its
    files."""
    trees, files = _run_paths(Path(workdir))
    for flag, path in outputs.items():
        if path is None:
            continue
        where = Path(path).resolve()  # links and .. followed, as the write would
        inside = next((tree for tree in trees if where.is_relative_to(tree)), None)
        if inside is not None:
            what, fix = f"inside the run's {trees[inside]} ({where})", f"a path outside {inside}"
        elif where in files:
            what, fix = f"the run's own {files[where]}", "another file"
        else:
            continue
        raise ValueError(
            f"{flag} {path} is {what}; evaluate, predict and export write nothing into the "
            f"run they read (a step's files certify it): choose {fix}."
        )
