"""``resolve_run``: everything a training run decides before it writes anything.

``train_and_evaluate`` starts from it, and ``train --print-config`` shows its spec's config
(what ``config.json`` records) without training: one code path, so the printed config and
the errors of bad input are the run's own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path
from typing import NamedTuple

import jax
from flax import nnx

from layoutlab.data import Dataset
from layoutlab.train.config import TrainConfig, validate
from layoutlab.train.init_weights import run_values, with_init_weights
from layoutlab.train.lr_schedule import check_run_steps
from layoutlab.train.metrics import CHECKPOINT_DIR
from layoutlab.train.resume import check_resume
from layoutlab.train.run_checks import check_dataset as _check_dataset
from layoutlab.train.run_data import load_run_data, with_data_fingerprint
from layoutlab.train.run_identity import numerics_environment
from layoutlab.train.spec import RunSpec, resolve_spec
from layoutlab.train.step_schedule import StepSchedule, make_step_schedule
from layoutlab.train.workdir import WorkdirError, filesystem_error, make_workdir

__all__ = ["RunStart", "filesystem_errors", "resolve_run"]


class RunStart(NamedTuple):
    """What a run decided before it writes anything (``resolve_run``)."""

    spec: RunSpec
    dataset: Dataset
    schedule: StepSchedule
    model: nnx.Module  # abstract
    init_values: dict | None  # the --init weights converted for the model (train.init_weights)


def resolve_run(
    config: TrainConfig, workdir: Path | None, *, resume: bool = False, announce: bool = False
) -> RunStart:
    """What ``train_and_evaluate`` decides before it writes anything: the run's spec (its
    record without a run id, whose automatic fields are filled in and whose conv plans are
    as ``config`` gives them: a run decides those when it starts), data set, schedule and
    abstract model; every config error is raised here. Reads only (``train --print-config``
    shows the spec's config): nothing is compiled, tuned or written. ``workdir``: the run's,
    read on ``resume``; None where there is none yet (no --workdir) and no resume.
    ``announce``: print the --init head's note (a run starting, not resuming or previewed)."""
    asked = config
    config = validate(config, jax.device_count())
    dataset = load_run_data(config)
    config = with_data_fingerprint(config, dataset)
    config, init_weights = with_init_weights(config)
    # What the run records of itself: an id carried in (another run's config.json) is not its.
    config = dataclasses.replace(config, run_id=None, jax_numerics=numerics_environment())
    with filesystem_errors(workdir):
        schedule = make_step_schedule(config, dataset)
        # The one resolution of the run: below, everything takes the spec, and what the run
        # decides later (its resumed record, its conv plans) changes it as a value.
        per_epoch = schedule.steps_per_epoch / schedule.accum_steps  # optimizer steps
        spec = resolve_spec(config, schedule.total_steps, jax.device_count(), per_epoch)
        if resume:
            # Before the model is built: a changed model is then named as such, not by its
            # conv plan. Reads only; the lock in train_and_evaluate keeps a second trainer out.
            make_workdir(workdir, create=False)
            note = (lambda m: print(m, file=sys.stderr)) if jax.process_index() == 0 else None
            spec = check_resume(spec, workdir, workdir / CHECKPOINT_DIR, asked, note)
        # After the resume check, which names a changed field first.
        check_run_steps(spec.config, schedule.total_steps, per_epoch)
        model = _check_dataset(spec, dataset)
        # Weights that do not fit fail here, before the workdir.
        values = run_values(spec, dataset, model, init_weights, announce=announce)
        return RunStart(spec, dataset, schedule, model, values)


@contextlib.contextmanager
def filesystem_errors(workdir: Path):
    """A filesystem error inside as the one-line ``WorkdirError`` naming the path and fix."""
    try:
        yield
    except WorkdirError:
        raise
    except Exception as e:
        error = filesystem_error(e, workdir)
        if error is None:
            raise
        raise error from None
