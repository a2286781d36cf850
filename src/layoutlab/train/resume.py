"""Resume checks: what a resumed run may change, and restoring its newest usable checkpoint.

Every checkpoint carries the resolved config that wrote it (``extra["config"]``), and so does
``config.json``. A resumed run is compared with it field by field: any field outside
``MAY_CHANGE`` that differs is refused with a one-line error naming it, since it would
silently train another model, under another policy or on another data stream than the one
the checkpoint holds. Fields in ``FROM_CHECKPOINT`` are not the user's to set on resume:
they are taken from the checkpoint. Of the fields that may change, a change of one in
``NOTED`` (how the same computation runs) is said in one line, old -> new. The run id is
the run's own (its ``config.json``), and the JAX settings that change numbers
(``train.run_identity``) must be those the run was trained with.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from layoutlab.train.checkpoint import Checkpointer, newest_meta
from layoutlab.train.config import TrainConfig, field_names, with_legacy_defaults
from layoutlab.train.init_weights import init_change
from layoutlab.train.metrics import CONFIG_FILE, read_records
from layoutlab.train.run_data import data_change
from layoutlab.train.run_identity import environment_change
from layoutlab.train.state import TrainState

if TYPE_CHECKING:
    from layoutlab.train.spec import RunSpec

__all__ = [
    "FROM_CHECKPOINT",
    "MAY_CHANGE",
    "NOTED",
    "ResumeError",
    "check_resume",
    "nothing_to_resume",
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
        "layer_impl",
        "xla_options",
        "cpu_fast",
        "log_every",
        "tensorboard",
        "param_sharding",
        "early_stop",  # how long, as epochs: a stopped run resumed with more patience goes on
    }
)
# A resumed run keeps its conv plans and where its layers compute (the stored kernels of a
# "layout"-storage run follow the latter).
FROM_CHECKPOINT = ("conv_plan", "eval_conv_plan", "activation_storage")
# May change, but changes how the run computes (its speed, and with some its last bits):
# a resume says so.
NOTED = (
    "eval_batch_size",
    "data_parallel",
    "remat",
    "conv_algorithm",
    "layer_impl",
    "xla_options",
    "cpu_fast",
    "param_sharding",
)
# Recorded by the run itself, compared on their own below.
_RECORDED = ("data_fingerprint", "run_id", "jax_numerics", "init_fingerprint")


class ResumeError(ValueError):
    """A resume that would change the run, or that has no run to continue."""


def saved_run_config(
    workdir: Path, checkpoint_dir: Path, *, prefer_config_json: bool = False
) -> tuple[dict, str] | None:
    """``(config dict, where it came from)`` of the run in ``workdir``, or None: the newest
    readable checkpoint's config (what a resume continues) or ``config.json``, whichever
    ``prefer_config_json`` puts first."""

    def from_checkpoint():
        # Another run's step, or a step under another step's name, says nothing of this run.
        found = newest_meta(checkpoint_dir, recorded_run_id(workdir))
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


def recorded_run_id(workdir: Path) -> str | None:
    """The run id in ``workdir``'s ``config.json``; None without one (a run from before run
    ids, or an unreadable file, which the caller reports)."""
    try:
        saved = json.loads((workdir / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return None
    run_id = saved.get("run_id") if isinstance(saved, dict) else None
    return run_id if isinstance(run_id, str) else None


def nothing_to_resume(workdir: Path) -> ResumeError:
    """The error for a workdir without config.json or checkpoint: a wrong path, or a run
    killed before it wrote either."""
    began = workdir.is_dir() and any(workdir.iterdir())
    return ResumeError(
        f"Nothing to resume in {workdir}: it has no {CONFIG_FILE} and no checkpoint"
        + (
            " (its run was stopped before it began training); start it again without "
            "--resume (resume=False)."
            if began
            else "; check the path, or start a new run there without --resume (resume=False)."
        )
    )


def _canonical(name: str, value, model: str | None = None):
    """What ``value`` of field ``name`` means, so that spellings of one setting compare equal
    (``nhwc`` and ``NHWC``, ``p=f32,c=f32,o=f32`` and ``fp32``, ``model_kwargs`` of ``model``
    with a default spelled out or left out)."""
    try:
        if name == "layout":
            from layoutlab.layout import parse_layout

            return parse_layout(value)
        if name == "precision":
            from layoutlab.precision import get_policy

            return get_policy(value)
        if name == "model":
            from layoutlab import models

            return models.spec(value).name
        if name == "model_kwargs" and model is not None:
            from layoutlab.train.model_checks import with_builder_defaults

            return with_builder_defaults(model, value)
    except (ValueError, KeyError):
        pass  # a saved value this version no longer reads: compared as written
    return value


def _refuse(workdir: Path, name: str, asked, saved, source: str) -> ResumeError:
    return ResumeError(
        f"Cannot resume {workdir} with {name}={asked!r}: the run was trained with "
        f"{name}={saved!r} ({source}), and {name} may not change within a run. "
        "Drop the setting that changes it, or start a new workdir."
    )


def _explicit(asked: TrainConfig | None, name: str) -> bool:
    """Whether the caller set ``name`` itself (an ``"auto"``/None value asks for nothing)."""
    if asked is None:
        return False
    return getattr(asked, name) not in (None, "auto")


def _noted_changes(have: dict, saved: dict) -> str | None:
    changed = [
        f"{name} {saved[name]!r} -> {have[name]!r}"
        for name in NOTED
        if name in saved and have[name] != saved[name]
    ]
    return "; ".join(changed) if changed else None


def check_resume(
    spec: RunSpec,
    workdir: Path,
    checkpoint_dir: Path,
    asked: TrainConfig | None = None,
    log: Callable[[str], None] | None = None,
) -> RunSpec:
    """``spec`` with the ``FROM_CHECKPOINT`` fields of the saved run; raises
    ``ResumeError`` if there is no run to continue or a field outside ``MAY_CHANGE`` differs
    in meaning (spellings of one value are equal, and the saved spelling is kept).
    ``asked`` is the config as given, before resolution: a ``FROM_CHECKPOINT`` field it sets
    explicitly to another value than the run's is refused, not replaced. ``log`` gets one
    line naming the ``NOTED`` fields that change. The result carries the run's id (None for
    a run from before run ids: the caller makes one) and records the saved spelling of each
    setting (``RunSpec.with_record``)."""
    config = spec.config
    found = saved_run_config(workdir, checkpoint_dir)
    if found is None:
        raise nothing_to_resume(workdir)
    saved, source = found
    saved = with_legacy_defaults(saved)  # e.g. activation_storage, from before it existed
    have = config.to_dict()
    if change := data_change(config, saved.get("data_fingerprint"), config.data_fingerprint):
        raise ResumeError(f"Cannot resume {workdir}: {change}")
    if change := environment_change(saved.get("jax_numerics"), config.jax_numerics or {}):
        raise ResumeError(f"Cannot resume {workdir}: {change}")
    saved_id = saved.get("run_id")
    kept = {"run_id": recorded_run_id(workdir) or (saved_id if isinstance(saved_id, str) else None)}
    for name in field_names():
        if name in MAY_CHANGE or name in FROM_CHECKPOINT or name not in saved:
            continue
        if name in _RECORDED:
            continue  # compared above, with what changed named
        if have[name] == saved[name]:
            continue
        model = have["model"]
        if _canonical(name, have[name], model) != _canonical(name, saved[name], model):
            raise _refuse(workdir, name, have[name], saved[name], source)
        kept[name] = saved[name]
    # After the fields: another init path is named as such, not by its contents.
    if change := init_change(config, saved.get("init_fingerprint"), config.init_fingerprint):
        raise ResumeError(f"Cannot resume {workdir}: {change}")
    for name in FROM_CHECKPOINT:
        if name not in saved:
            continue
        value = getattr(TrainConfig.from_dict({name: saved[name]}), name)
        if _explicit(asked, name) and getattr(asked, name) != value:
            raise ResumeError(
                f"Cannot resume {workdir} with {name}={getattr(asked, name)!r}: a run keeps "
                f"its {name} ({value!r} in {source}). Drop that setting, or start a new "
                "workdir."
            )
        kept[name] = value
    if log is not None and (changed := _noted_changes(have, saved)):
        log(f"note: resuming {workdir} with changed settings: {changed}.")
    from layoutlab.fast_defaults import resolve_activation_storage

    plans = {name: kept.pop(name, getattr(config, name)) for name in FROM_CHECKPOINT}
    spec = spec.with_record(**kept).with_plan(plans["conv_plan"], plans["eval_conv_plan"])
    # Where the run's layers compute (the stored kernels of a "layout" run follow it).
    storage = resolve_activation_storage(plans["activation_storage"])
    return dataclasses.replace(
        spec,
        config=dataclasses.replace(spec.config, activation_storage=storage),
        activation_storage=storage,
    )


def _history(metrics_path: Path, checkpoint_every: int) -> list[int]:
    """Steps of recorded evaluations past the first checkpoint: the loop passes a save only
    once it is finished, so such records mean a finished checkpoint existed."""
    return [r["step"] for r in read_records(metrics_path) if r.get("step", 0) > checkpoint_every]


def restore_or_start(
    ckpt: Checkpointer, abstract, schedule, metrics_path: Path, log
) -> tuple[TrainState | None, int, dict]:
    """``(state, step, the checkpoint's extra)`` of the newest checkpoint that restores, or
    ``(None, 0, {})`` with a notice on ``ckpt.log`` (shown even when quiet) when none does
    and the run has no history beyond its first save (a kill during that save). With no
    usable checkpoint but a longer history the resume is refused: starting again from step
    0 would replace that history, which only a run without --resume may do.
    ``check_resume`` has compared the config already."""
    had = ckpt.steps()
    found = ckpt.restore_latest(abstract)
    if found is None:
        why = "none restores (moved to corrupt/)" if had else "none was finished"
        history = _history(metrics_path, schedule.checkpoint_every)
        if history:
            raise ResumeError(
                f"Cannot resume {ckpt.directory.parent}: it has no usable checkpoint ({why}) "
                f"but {metrics_path.name} records the run up to step {max(history)}; to train "
                "it again from step 0 (replacing that history) run without --resume, or "
                "restore its checkpoints."
            )
        ckpt.log(
            f"note: no usable checkpoint under {ckpt.directory} ({why}); starting from step 0 "
            "with the run's config."
        )
        return None, 0, {}
    state, step = found
    accum_steps = schedule.accum_steps
    if int(state.step) != step * accum_steps:
        raise ResumeError(
            f"Checkpoint {ckpt.step_dir(step)} is at micro-step {int(state.step)}, expected "
            f"{step * accum_steps} for accum_steps={accum_steps}; resume with the "
            "accum_steps of the run that wrote it."
        )
    if step > schedule.total_steps:
        raise ResumeError(
            f"Cannot resume {ckpt.directory.parent} for {schedule.total_steps} steps: the run "
            f"is at step {step} already; ask for more steps (--steps N with N >= {step}, or "
            "more --epochs), or read it as it is with `layoutlab evaluate`."
        )
    log(f"Resuming from {ckpt.step_dir(step)} (step {step}).")
    return state, step, ckpt.read_meta(step).get("extra", {})
