"""Resume checks: what a resumed run may change, and restoring its newest usable checkpoint.

Every checkpoint carries the resolved config that wrote it (``extra["config"]``), and so does
``config.json``. A resumed run is compared with it field by field: any field outside
``MAY_CHANGE`` that differs is refused with a one-line error naming it, since it would
silently train another model, under another policy or on another data stream than the one
the checkpoint holds. Fields in ``FROM_CHECKPOINT`` are not the user's to set on resume:
they are taken from the checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from layoutlab.train.checkpoint import Checkpointer, newest_meta
from layoutlab.train.config import TrainConfig, field_names, with_legacy_defaults
from layoutlab.train.metrics import CONFIG_FILE
from layoutlab.train.state import TrainState

__all__ = [
    "FROM_CHECKPOINT",
    "MAY_CHANGE",
    "ResumeError",
    "check_resume",
    "restore_or_start",
    "saved_run_config",
]

# How long, how often to evaluate and save, and how the same computation is run.
MAY_CHANGE = frozenset(
    {
        "epochs",
        "num_steps",
        "eval_every",
        "checkpoint_every",
        "keep_checkpoints",
        "eval_batch_size",
        "data_parallel",
        "remat",
        "conv_algorithm",
        "xla_options",
        "cpu_fast",
        "log_every",
        "tensorboard",
        "param_sharding",
    }
)
# A resumed run keeps its conv plan and where its layers compute (the stored kernels of a
# "layout"-storage run follow the latter).
FROM_CHECKPOINT = ("conv_plan", "activation_storage")


class ResumeError(ValueError):
    """A resume that would change the run, or that has no run to continue."""


def saved_run_config(
    workdir: Path, checkpoint_dir: Path, *, prefer_config_json: bool = False
) -> tuple[dict, str] | None:
    """``(config dict, where it came from)`` of the run in ``workdir``, or None: the newest
    readable checkpoint's config (what a resume continues) or ``config.json``, whichever
    ``prefer_config_json`` puts first."""

    def from_checkpoint():
        found = newest_meta(checkpoint_dir)
        if found is not None and isinstance(found[0].get("extra", {}).get("config"), dict):
            return found[0]["extra"]["config"], f"checkpoint {found[1]}"
        return None

    def from_config_json():
        path = workdir / CONFIG_FILE
        if not path.is_file():
            return None
        try:
            saved = json.loads(path.read_text())
        except ValueError as e:
            raise ResumeError(f"{path} is not valid JSON ({e}); fix or delete it.") from None
        return (saved, str(path)) if isinstance(saved, dict) else None

    order = (
        (from_config_json, from_checkpoint)
        if prefer_config_json
        else (from_checkpoint, from_config_json)
    )
    for source in order:
        if (found := source()) is not None:
            return found
    return None


def check_resume(config: TrainConfig, workdir: Path, checkpoint_dir: Path) -> TrainConfig:
    """``config`` (resolved) with the ``FROM_CHECKPOINT`` fields of the saved run; raises
    ``ResumeError`` if there is no run to continue or a field outside ``MAY_CHANGE`` differs."""
    found = saved_run_config(workdir, checkpoint_dir)
    if found is None:
        raise ResumeError(
            f"Nothing to resume in {workdir}: it has no {CONFIG_FILE} and no checkpoint; "
            "check the path, or start a new run there without --resume (resume=False)."
        )
    saved, source = found
    saved = with_legacy_defaults(saved)  # e.g. activation_storage, from before it existed
    asked = config.to_dict()
    for name in field_names():
        if name in MAY_CHANGE or name in FROM_CHECKPOINT or name not in saved:
            continue
        if asked[name] != saved[name]:
            raise ResumeError(
                f"Cannot resume {workdir} with {name}={asked[name]!r}: the run was trained with "
                f"{name}={saved[name]!r} ({source}), and {name} may not change within a run. "
                "Drop the setting that changes it, or start a new workdir."
            )
    taken = {
        name: getattr(TrainConfig.from_dict({name: saved[name]}), name)
        for name in FROM_CHECKPOINT
        if name in saved and name in asked
    }
    return dataclasses.replace(config, **taken) if taken else config


def restore_or_start(
    ckpt: Checkpointer, abstract, accum_steps: int, log
) -> tuple[TrainState | None, int]:
    """``(state, step)`` of the newest checkpoint that restores, or ``(None, 0)`` with a
    notice on ``ckpt.log`` (shown even when quiet) when none does: a kill during the first
    save. ``check_resume`` has compared the config already."""
    had = ckpt.steps()
    found = ckpt.restore_latest(abstract)
    if found is None:
        why = "none restores (moved to corrupt/)" if had else "none was finished"
        ckpt.log(
            f"note: no usable checkpoint under {ckpt.directory} ({why}); starting from step 0 "
            "with the run's config."
        )
        return None, 0
    state, step = found
    if int(state.step) != step * accum_steps:
        raise ResumeError(
            f"Checkpoint {ckpt.step_dir(step)} is at micro-step {int(state.step)}, expected "
            f"{step * accum_steps} for accum_steps={accum_steps}; resume with the "
            "accum_steps of the run that wrote it."
        )
    log(f"Resuming from {ckpt.step_dir(step)} (step {step}).")
    return state, step
