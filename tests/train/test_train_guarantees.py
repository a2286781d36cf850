"""What ``layoutlab train`` promises about a run (docs/guides/guarantees.md): no silent
config change on resume, no default run in place of a missing one, no non-finite
hyperparameter, no traceback for bad model kwargs or filesystem faults, one writer
per workdir. Each refusal is checked for its exit code (2), its one-line ``error:`` message
and that nothing on disk changed.

The CLI is driven in-process through ``layoutlab.cli.main`` (the console script's entry).
"""

import contextlib
import errno
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest
from cli_helpers import one_line_error as _one_line_error

from layoutlab import cli, models
from layoutlab.train import checkpoint as checkpoint_module
from layoutlab.train import loop
from layoutlab.train.checkpoint import read_checkpoint
from layoutlab.train.config import TrainConfig, validate
from layoutlab.train.loop import train_and_evaluate
from layoutlab.train.resume import MAY_CHANGE, ResumeError
from layoutlab.train.workdir import LOCK_FILE, WorkdirError, WorkdirLock

# The resumes below compile the same programs again (a train step per --steps, the eval
# step); the module's persistent cache (tests/conftest.py) serves the repeats. The first test
# uses no run, so ``guarantees_run``, when this module builds it, compiles into that cache.
pytestmark = pytest.mark.usefixtures("shared_compiles")

# The resumes read the data-parallel train step back from the cache too (conftest's
# PARTITIONED_KEY): every run here compiles one conv plan, the table's.
CACHE_PARTITIONED = True

TINY = ["--set", "model_kwargs.width=4", "--set", "model_kwargs.hidden=16"]
RUN = ["--steps", "4", "--batch-size", "32", "--seed", "1", "--set", "eval_every=2", *TINY]
# The resumes to step 6 are compared with no other run (they check what is kept, refused or
# reported), so they compile at LLVM level 0 (docs/development.md), the option xla_options
# may change on resume; a resume compared bit for bit with ``guarantees_run`` keeps its level.
LEVEL_0 = ["--xla-option", "xla_backend_optimization_level=0"]


def shared_cache_env(env, tmp_path_factory) -> dict:
    """``env`` with a persistent compilation cache shared by this module and
    test_train_integrity on one xdist worker: whichever builds ``guarantees_run`` there
    (under ``shared_compiles``) leaves its programs to the other's resumes of it."""
    cache = tmp_path_factory.getbasetemp() / "guarantees_run_jax_cache"
    cache.mkdir(exist_ok=True)
    return {**env, "JAX_COMPILATION_CACHE_DIR": str(cache)}


@pytest.fixture(scope="module")
def env(env, tmp_path_factory):
    return shared_cache_env(env, tmp_path_factory)


def _train(capsys, *argv):
    """``(exit code, stdout, stderr)`` of ``layoutlab train ARGV --quiet``."""
    code = cli.main(["train", *argv, "--quiet"])
    out, err = capsys.readouterr()
    return code, out, err


def _snapshot(workdir):
    """Every file under ``workdir`` with its digest: "nothing on disk changed" is equality."""
    return {
        str(p.relative_to(workdir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(workdir.rglob("*"))
        if p.is_file() and p.name != LOCK_FILE
    }


@pytest.fixture
def run_dir(guarantees_run):
    """A finished 4-step CLI run of ``RUN`` (checkpoints at steps 2 and 4); read only."""
    return guarantees_run


# -- item 2: loss_scale "none" stays none -------------------------------------------------


def test_loss_scale_none_stays_none_for_float16_compute(capsys):
    from layoutlab.loss_scale import DynamicLossScale, NoOpLossScale
    from layoutlab.train.spec import resolve_spec

    def resolved(config):
        spec = resolve_spec(validate(config, 4), num_devices=4)
        return spec.config.loss_scale, type(spec.loss_scale)

    none = ("none", NoOpLossScale)
    assert resolved(TrainConfig(precision="mixed_fp16", loss_scale=None)) == none
    assert resolved(TrainConfig(precision="mixed_fp16", loss_scale="none")) == none
    assert resolved(TrainConfig(precision="mixed_fp16")) == ("dynamic", DynamicLossScale)  # auto
    parser = cli.build_parser()
    from layoutlab.train.command import build_config

    args = parser.parse_args(["train", "--precision", "mixed_fp16", "--loss-scale", "none"])
    assert resolved(build_config(args)[0]) == none
    args = parser.parse_args(["train", "--precision", "mixed_fp16", "--set", "loss_scale=none"])
    assert resolved(build_config(args)[0]) == none


# -- item 3 and the resume comparison ------------------------------------------------------


@pytest.mark.parametrize(
    "flags,field",
    [
        (["--precision", "mixed_bf16"], "precision"),
        (["--precision", "mixed_fp16"], "precision"),
        (["--loss-scale", "static:128"], "loss_scale"),
        (["--lr", "0.01"], "learning_rate"),
        (["--optimizer", "sgd"], "optimizer"),
        (["--batch-size", "16"], "batch_size"),
        (["--seed", "2"], "seed"),
        (["--layout", "NCHW"], "layout"),
        (["--set", "model_kwargs.hidden=8"], "model_kwargs"),
        (["--set", "warmup_steps=3"], "warmup_steps"),
        (["--set", "augment=true"], "augment"),
        (["--val-fraction", "0.1"], "val_fraction"),
        (["--keep-best", "test_accuracy"], "keep_best"),
        (["--auto-augment", "trivial"], "auto_augment"),
        (["--mixup", "0.2"], "mixup"),
        (["--label-smoothing", "0.1"], "label_smoothing"),
    ],
)
def test_resume_refuses_a_changed_field(copy, capsys, flags, field):
    before = _snapshot(copy)
    code, _, err = _train(capsys, "--workdir", str(copy), "--resume", *flags)
    assert code == 2
    _one_line_error(err, f"with {field}=", "may not change within a run", str(copy))
    assert _snapshot(copy) == before


def test_resume_refuses_precision_change_from_python(copy):
    saved = json.loads((copy / "config.json").read_text())
    for precision in ("mixed_bf16", "mixed_fp16"):
        config = TrainConfig.from_dict({**saved, "precision": precision})
        with pytest.raises(ResumeError, match="with precision=.*may not change"):
            train_and_evaluate(config, copy, resume=True, quiet=True)


@pytest.fixture(scope="module")
def resumed_over_a_stale_lock(guarantees_run, tmp_path_factory):
    """A copy of the run resumed with ``--steps 6 --set eval_every=3`` (and ``LEVEL_0``) over
    the lock record of a dead process: ``(workdir, exit code, stderr, the dead pid)``. One
    training resume serves the length-and-cadence test and the stale-lock test (item 7)."""
    workdir = tmp_path_factory.mktemp("stale_lock") / "run"
    shutil.copytree(guarantees_run, workdir)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    owner = {"pid": int(dead.stdout), "host": socket.gethostname()}
    (workdir / LOCK_FILE).write_text(json.dumps(owner))
    argv = ["train", "--workdir", str(workdir), "--resume", "--steps", "6", *LEVEL_0]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main([*argv, "--set", "eval_every=3", "--quiet"])
    return workdir, code, err.getvalue(), owner["pid"]


def test_resume_may_change_length_and_cadence(resumed_over_a_stale_lock, run_dir):
    # The guarantees page's list, word for word.
    assert MAY_CHANGE == {
        "epochs", "num_steps", "eval_every", "checkpoint_every", "keep_checkpoints",
        "eval_batch_size", "data_parallel", "remat", "conv_algorithm", "layer_impl",
        "xla_options", "log_every", "tensorboard", "param_sharding", "cpu_fast", "early_stop",
    }  # fmt: skip
    copy, code, err, _ = resumed_over_a_stale_lock
    assert code == 0, err
    assert read_checkpoint(copy / "checkpoints")[1]["step"] == 6
    # Continued from step 4 (a fresh start would have evaluated at 3 and 6), and 4's
    # checkpoint is the original run's, untouched.
    steps = [json.loads(line)["step"] for line in (copy / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 4, 6]
    got, want = (read_checkpoint(d / "checkpoints", step=4)[0] for d in (copy, run_dir))
    for path in want:
        np.testing.assert_array_equal(got[path], want[path], err_msg=path)


# -- item 4: --resume without config.json -------------------------------------------------


def test_resume_without_config_json_uses_the_checkpoints_config(copy, run_dir, capsys):
    (copy / "config.json").unlink()
    shutil.rmtree(copy / "checkpoints" / "4")  # so there is something left to train
    code, _, err = _train(capsys, "--workdir", str(copy), "--resume")
    assert code == 0, err
    got, meta = read_checkpoint(copy / "checkpoints")
    want, _ = read_checkpoint(run_dir / "checkpoints")
    assert meta["step"] == 4
    for path in want:  # the run's own config (width 4, seed 1), not the default one
        np.testing.assert_array_equal(got[path], want[path], err_msg=path)
    assert json.loads((copy / "config.json").read_text())["seed"] == 1


@pytest.mark.parametrize("kind", ["missing", "empty"])
def test_resume_with_nothing_to_resume_is_an_error(tmp_path, capsys, kind):
    workdir = tmp_path / "run"
    if kind == "empty":
        workdir.mkdir()
    code, _, err = _train(capsys, "--workdir", str(workdir), "--resume")
    assert code == 2
    _one_line_error(err, "Nothing to resume in", str(workdir), "without --resume")
    assert not workdir.exists() if kind == "missing" else list(workdir.iterdir()) == []
    with pytest.raises(WorkdirError if kind == "missing" else ResumeError, match="resume"):
        train_and_evaluate(TrainConfig(), workdir, resume=True, quiet=True)


# -- items 5 and 6: numbers and model kwargs ----------------------------------------------


@pytest.mark.parametrize(
    "flags,fragment",
    [
        (["--lr", "inf"], "learning_rate must be a finite number > 0, got inf"),
        (["--lr", "nan"], "learning_rate must be a finite number > 0, got nan"),
        (["--lr", "-0.1"], "learning_rate must be a finite number > 0"),
        (["--lr", "0"], "learning_rate must be a finite number > 0"),
        (["--set", "weight_decay=-inf"], "weight_decay must be a finite number >= 0"),
        (["--set", "momentum=nan"], "momentum must be a finite number >= 0 and < 1"),
        (["--set", "momentum=1"], "momentum must be a finite number >= 0 and < 1"),
        # Checked as the float32 values they train as: inf, 0 or 1 there are refused too.
        (["--lr", "1e300"], "learning_rate=1e+300 overflows float32"),
        (["--lr", "1e-40"], "learning_rate=1e-40 underflows float32"),
        (["--set", "weight_decay=1e39"], "weight_decay=1e+39 overflows float32"),
        (["--set", "momentum=0.999999999"], "momentum must be a finite number >= 0 and < 1 in"),
        # Counts beyond the int32 step counters, refused before anything is written.
        (["--steps", "100000000000000000000"], "num_steps=100000000000000000000 is more than"),
        (["--steps", "1000000000", "--accum-steps", "4"], "(4000000000 batches) are more than"),
        (["--set", "warmup_steps=10000000000"], "warmup_steps=10000000000 is more than"),
        (["--steps", "0"], "num_steps must be a positive integer"),
        (["--set", "keep_checkpoints=0"], "keep_checkpoints must be a positive integer"),
        (["--set", "warmup_steps=-1"], "warmup_steps must be >= 0"),
        (["--loss-scale", "static:inf"], "loss_scale"),
        (["--set", "model_kwargs.width=abc"], "model_kwargs.width of 'small_cnn' must be an int"),
        (["--set", "model_kwargs.width=2.5"], "model_kwargs.width of 'small_cnn' must be an int"),
        (["--set", "model_kwargs.dropout=NaN"], "model_kwargs.dropout must be finite"),
        (["--set", "model_kwargs.dropout=nan"], "must be a number (its default is 0.1)"),
        (["--set", "model_kwargs.width=-3"], "model_kwargs.width of 'small_cnn' must be >= 1"),
        (["--set", "model_kwargs.hidden=0"], "model_kwargs.hidden of 'small_cnn' must be >= 1"),
        # The ranges the model declares (models.ModelSpec.ranges): a rate of 1.5 is no rate.
        (["--set", "model_kwargs.dropout=1.5"], "dropout of 'small_cnn' must be in [0, 1)"),
        (["--set", "model_kwargs.dropout=-0.1"], "dropout of 'small_cnn' must be in [0, 1)"),
    ],
)
def test_bad_numbers_are_refused_before_anything_runs(tmp_path, capsys, flags, fragment):
    workdir = tmp_path / "run"
    code, _, err = _train(capsys, "--workdir", str(workdir), "--steps", "1", *flags)
    assert code == 2
    _one_line_error(err, fragment)
    assert not workdir.exists()


# -- item 7: filesystem faults and the lock -----------------------------------------------


def test_workdir_that_is_a_file(tmp_path, capsys):
    victim = tmp_path / "notes.txt"
    victim.write_text("keep me")
    code, _, err = _train(capsys, *RUN, "--workdir", str(victim))
    assert code == 2
    _one_line_error(err, str(victim), "is not a directory", "--workdir")
    assert victim.read_text() == "keep me"


def test_second_trainer_on_a_workdir_is_refused(copy, capsys):
    before = _snapshot(copy)
    with WorkdirLock(copy):  # the first trainer, still running
        code, _, err = _train(capsys, "--workdir", str(copy), "--resume", "--steps", "6")
    assert code == 2
    line = _one_line_error(err, "is in use by another layoutlab run", "--workdir")
    assert f"pid {os.getpid()} on {socket.gethostname()}" in line
    assert _snapshot(copy) == before


def test_stale_lock_of_a_dead_process_is_taken_over(resumed_over_a_stale_lock):
    copy, code, err, pid = resumed_over_a_stale_lock  # a resume to step 6
    assert code == 0, err
    assert f"was left by pid {pid}, which is no longer running" in err
    record = json.loads((copy / LOCK_FILE).read_text())
    assert record["pid"] == os.getpid() and record["released"]  # released at exit


@pytest.mark.parametrize(
    "code_,fragment",
    [
        (errno.ENOSPC, "no space left on its device"),
        (errno.EACCES, "permission denied"),
        (errno.EROFS, "read-only filesystem"),
    ],
)
def test_filesystem_error_while_saving_is_one_line(copy, capsys, monkeypatch, code_, fragment):
    """The error as orbax reports it (wrapped), raised inside a checkpoint save."""
    before = _snapshot(copy)

    def failing_save(self, *args, **kwargs):
        try:
            raise OSError(code_, os.strerror(code_), str(self.directory / "6"))
        except OSError as e:
            raise RuntimeError("orbax: save failed") from e

    monkeypatch.setattr(checkpoint_module.ocp.CheckpointManager, "save", failing_save)
    code, _, err = _train(capsys, "--workdir", str(copy), "--resume", "--steps", "6", *LEVEL_0)
    assert code == 2
    note, *rest = err.splitlines()  # LEVEL_0 changes the run's xla_options: said first
    assert note.startswith("note: ") and "xla_options {} -> {" in note, err
    _one_line_error("\n".join(rest), str(copy / "checkpoints" / "6"), fragment)
    kept = {k: v for k, v in before.items() if k.startswith("checkpoints/")}
    assert {k: v for k, v in _snapshot(copy).items() if k.startswith("checkpoints/")} == kept


def _mount_tmpfs(path, options):
    path.mkdir(exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True)  # fmt: skip
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.decode().strip()})")


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    _mount_tmpfs(mnt, "size=160k")  # the first checkpoint (~120 KiB) fits, the second not
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_real_disk_full_then_resume_after_freeing_space(small_disk, run_dir, capsys):
    """A real ENOSPC (a 160 KiB tmpfs), with orbax's own error path: one line, no event-loop
    traceback; after the disk grows, --resume finishes the run bit for bit."""
    workdir = small_disk / "run"
    code, _, err = _train(capsys, *RUN, "--workdir", str(workdir))
    assert code == 2
    _one_line_error(err, "no space left on its device", "--resume")
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    code, _, err = _train(capsys, "--workdir", str(workdir), "--resume")
    assert code == 0, err
    got, _ = read_checkpoint(workdir / "checkpoints")
    want, _ = read_checkpoint(run_dir / "checkpoints")
    for path in want:
        np.testing.assert_array_equal(got[path], want[path], err_msg=path)


def test_read_only_filesystem(tmp_path, capsys):
    mnt = tmp_path / "ro"
    _mount_tmpfs(mnt, "size=1m,ro")
    try:
        code, _, err = _train(capsys, *RUN, "--workdir", str(mnt / "run"))
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    assert code == 2
    _one_line_error(err, str(mnt / "run"), "read-only filesystem", "--workdir")


def test_models_tiny_is_what_the_cli_flags_set():
    """TINY's flags are small_cnn's own tiny variant, so these runs stay small."""
    assert models.spec("small_cnn").tiny == {"width": 4, "hidden": 16}


def test_resuming_a_finished_run_says_so_and_changes_nothing(copy, monkeypatch, capsys):
    # The run is at its last step: the resume compiles nothing, writes nothing, and says how
    # to continue it.
    before = _snapshot(copy)

    def must_not_compile(*args, **kwargs):
        raise AssertionError("compiled a training step for a finished run")

    monkeypatch.setattr(loop, "compile_train_step", must_not_compile)
    code, _, err = _train(capsys, "--workdir", str(copy), "--resume")
    assert code == 0, err
    assert "is complete at step 4 of 4" in err and "--steps" in err, err
    assert _snapshot(copy) == before
