"""Validation split, best checkpoint, early stop and ``summary.json`` of a training run
(``val_fraction``, ``keep_best``, ``early_stop``; ``train.best``, ``train.best_run``)."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cli_helpers import one_line_error, run_cli
from flax import nnx

from layoutlab import models
from layoutlab.infer.evaluate import evaluate_workdir
from layoutlab.infer.load import load_model, open_run
from layoutlab.train import checkpoint
from layoutlab.train.best import Best, parse_metric
from layoutlab.train.best_run import BestKeeper
from layoutlab.train.checkpoint import Checkpointer, read_checkpoint
from layoutlab.train.config import TrainConfig
from layoutlab.train.loop import train_and_evaluate
from layoutlab.train.summary import SUMMARY_KEYS

# Evaluations at steps 2, 4 and 6. keep_best watches val_loss the wrong way round (":max"):
# a training loss falls, so the best is an early evaluation and later ones are not better,
# which is what a resume that forgot the best so far would get wrong (it takes its first
# evaluation as the best). The test reads the best off the records, whatever they are.
BASE = TrainConfig(
    model_kwargs=models.spec("small_cnn").tiny,
    batch_size=32,
    num_steps=6,
    eval_every=2,
    seed=3,
    val_fraction=0.1,
    keep_best="val_loss:max",
    tensorboard=False,
    log_every=0,
    xla_options={"xla_backend_optimization_level": 0},  # compared only with its own runs
)


def _records(workdir):
    return [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]


def _summary(workdir):
    return json.loads((workdir / "summary.json").read_text())


pytestmark = pytest.mark.usefixtures("shared_compiles")  # the resume reads its programs back
# Its runs read the data-parallel train step back from the cache too (conftest's
# PARTITIONED_KEY): every run here compiles one conv plan, the table's.
CACHE_PARTITIONED = True


@pytest.fixture(scope="module")
def val_run(tmp_path_factory):
    """``BASE`` stopped in its save of step 6 (after step 6 was evaluated and recorded), then
    resumed from step 4 to the end: ``(workdir, the resume's final record)``. The resumed
    run evaluates step 6 again, which must not be taken for the best: the best so far comes
    from step 4's checkpoint."""
    workdir = tmp_path_factory.mktemp("val") / "run"

    def crash(phase, step):
        if (phase, step) == ("before_save", 6):
            raise KeyboardInterrupt(phase)

    previous = checkpoint.set_save_phase_hook(crash)
    try:
        with pytest.raises(KeyboardInterrupt):
            train_and_evaluate(BASE, workdir, quiet=True)
    finally:
        checkpoint.set_save_phase_hook(previous)
    assert [r["step"] for r in _records(workdir)] == [2, 4, 6]
    assert not (workdir / "summary.json").exists()  # written when a run finishes only
    record = train_and_evaluate(BASE, workdir, resume=True, quiet=True)
    return workdir, record


def test_evaluations_run_on_validation_and_the_test_split_once_at_the_end(val_run):
    workdir, record = val_run
    rows = _records(workdir)
    assert [r["step"] for r in rows] == [2, 4, 6]
    assert all("val_loss" in r and "val_accuracy" in r for r in rows)
    assert [("test_accuracy" in r) for r in rows] == [False, False, True]
    # The end's test evaluation is the one `layoutlab evaluate` makes, to the bit.
    evaluated = evaluate_workdir(workdir)
    assert (evaluated["test_loss"], evaluated["test_accuracy"]) == (
        record["test_loss"],
        record["test_accuracy"],
    )


def test_the_best_checkpoint_is_kept_and_read_back(val_run):
    workdir, _ = val_run
    rows = _records(workdir)
    best = max(rows, key=lambda r: r["val_loss"])  # ":max"
    summary = _summary(workdir)
    assert summary["best"]["step"] == best["step"]
    assert summary["best"]["value"] == best["val_loss"]
    assert sorted(p.name for p in (workdir / "best").iterdir() if p.name.isdigit()) == [
        str(best["step"])
    ]
    # Beside the newest ones, not among them: keep_checkpoints (3) keeps 2, 4 and 6.
    assert open_run(workdir, "best").step == best["step"]
    assert open_run(workdir, "latest").step == 6
    # The same arrays as the step's regular checkpoint (all of 2, 4 and 6 are kept).
    best_arrays, _ = read_checkpoint(workdir / "best")
    step_arrays, _ = read_checkpoint(workdir / "checkpoints", best["step"])
    assert best_arrays.keys() == step_arrays.keys()
    for path, value in step_arrays.items():
        np.testing.assert_array_equal(best_arrays[path], value, err_msg=path)
    # load_model takes "best" as open_run does: the model holds that step's parameters.
    got = jax.tree.leaves(nnx.state(load_model(workdir, "best"), nnx.Param))
    want = jax.tree.leaves(open_run(workdir, best["step"]).params)
    assert len(got) == len(want) > 0
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_summary_is_written_at_the_end(val_run):
    workdir, record = val_run
    summary = _summary(workdir)
    assert tuple(sorted(summary)) == tuple(sorted(SUMMARY_KEYS))
    assert summary["test"] == {
        "test_loss": record["test_loss"],
        "test_accuracy": record["test_accuracy"],
    }
    assert summary["final"]["val_loss"] == record["val_loss"]
    assert (summary["step"], summary["stopped_early"], summary["stop_reason"]) == (6, False, None)
    assert summary["run_id"] == json.loads((workdir / "config.json").read_text())["run_id"]
    assert summary["images_per_sec"] > 0 and summary["wall_time_s"] > 0


def test_a_resumed_run_keeps_the_best_so_far(val_run):
    workdir, _ = val_run
    rows = _records(workdir)
    best = max(rows, key=lambda r: r["val_loss"])
    summary = _summary(workdir)
    assert [r["step"] for r in rows] == [2, 4, 6]
    assert best["step"] != 6  # else this run could not tell a lost best from a kept one
    assert (summary["step"], summary["best"]["step"]) == (6, best["step"])
    assert summary["best"]["stale"] == len([r for r in rows if r["step"] > best["step"]])


def test_early_stop_stops_after_patience_evaluations_without_a_better_metric(tmp_path, capsys):
    """A learning rate of 1e-9 leaves every prediction as it was: val_accuracy is the same
    at each evaluation, never better, so patience 2 stops at the third evaluation."""
    config = dataclasses.replace(
        BASE, num_steps=20, eval_every=1, learning_rate=1e-9, keep_best="val_accuracy",
        early_stop=2,
    )  # fmt: skip
    workdir = tmp_path / "run"
    record = train_and_evaluate(config, workdir, quiet=True)
    out = capsys.readouterr().out
    stops = [line for line in out.splitlines() if line.startswith("early stop:")]
    assert stops == [
        f"early stop: val_accuracy has not improved on {record['val_accuracy']:.4f} (step 1) "
        "in 2 evaluations (early_stop=2)"
    ]
    assert [r["step"] for r in _records(workdir)] == [1, 2, 3]
    assert record["step"] == 3 and "test_accuracy" in record  # the test split still ran
    summary = _summary(workdir)
    assert summary["stopped_early"] and summary["stop_reason"] == stops[0]
    assert 3 in Checkpointer(workdir / "checkpoints").steps()
    # A resume finds it complete, and says why.
    before = (workdir / "summary.json").read_text()
    again = train_and_evaluate(config, workdir, resume=True, quiet=True)
    note = capsys.readouterr().err
    assert again["step"] == 3 and f"({stops[0]}; raise --early-stop to continue it)" in note
    assert (workdir / "summary.json").read_text() == before
    # A kill after the last checkpoint but before the summary: the resume writes it.
    (workdir / "summary.json").unlink()
    train_and_evaluate(config, workdir, resume=True, quiet=True)
    assert {**_summary(workdir), "wall_time_s": 1, "images_per_sec": 1} == {
        **json.loads(before), "wall_time_s": 1, "images_per_sec": 1
    }  # fmt: skip


@pytest.mark.parametrize("phase", ["before_save", "after_save", "after_manifest", "during_delete"])
def test_a_kill_while_saving_a_better_checkpoint_keeps_a_best(tmp_path, phase):
    """The best checkpoint is saved by train.checkpoint's commit order: stopped at any phase
    of the save of a better step (the hook raises where a crash test's kills), the previous
    best (or, once the new one is certified, the new one) still reads back."""
    keeper = BestKeeper(
        Best(parse_metric("val_loss", validation=True)),
        Checkpointer(tmp_path / "best", max_to_keep=1),
        None,
    )
    state = {"w": jnp.arange(3.0)}
    keeper.evaluated({"step": 1, "val_loss": 1.0}, state, {})

    def crash(at, step):
        if at == phase and step == 2:
            raise KeyboardInterrupt(at)

    previous = checkpoint.set_save_phase_hook(crash)
    try:
        with pytest.raises(KeyboardInterrupt):
            keeper.evaluated({"step": 2, "val_loss": 0.5}, {"w": jnp.arange(3.0) + 1}, {})
    finally:
        checkpoint.set_save_phase_hook(previous)
        keeper.close()
    arrays, meta = read_checkpoint(tmp_path / "best")
    want = {1: [0.0, 1.0, 2.0], 2: [1.0, 2.0, 3.0]}[meta["step"]]
    np.testing.assert_array_equal(arrays["['w']"], want)
    if phase in ("before_save", "after_save", "after_manifest"):  # step 1 not removed yet
        assert read_checkpoint(tmp_path / "best", 1)[1]["step"] == 1


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--val-fraction", "1"], "val_fraction must lie in (0, 1)"),
        (["--val-fraction", "-0.1"], "val_fraction must lie in (0, 1)"),
        (["--keep-best", "val_f1"], "keep_best: unknown metric 'val_f1'"),
        (["--keep-best", "val_accuracy"], "needs a validation split; add --val-fraction"),
        (["--keep-best", "test_loss:up"], "'up' is neither max nor min"),
        (["--keep-best", "test_loss", "--early-stop", "0"], "early_stop must be a positive"),
        (["--early-stop", "3"], "early_stop watches the keep_best metric"),
        (["--val-fraction", "0.001"], "with no held-out example; raise val_fraction"),
    ],
)
def test_bad_values_are_one_error_line(tmp_path, capsys, flags, fragment):
    workdir = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "--workdir", workdir, "--steps", "1", "--quiet", *flags)
    assert code == 2
    one_line_error(err, fragment)
    assert not workdir.exists()


def test_checkpoint_best_of_a_run_without_one_is_one_error_line(val_run, tmp_path, capsys):
    import shutil

    workdir = tmp_path / "run"
    shutil.copytree(val_run[0], workdir, ignore=shutil.ignore_patterns("best"))
    code, _, err = run_cli(capsys, "evaluate", "--workdir", workdir, "--checkpoint", "best")
    assert code == 2
    one_line_error(err, "has no best checkpoint", "--keep-best")
    with pytest.raises(SystemExit) as stopped:  # argparse's own error, one line as well
        run_cli(capsys, "predict", "--workdir", workdir, "--checkpoint", "good", "x.png")
    assert stopped.value.code == 2
    one_line_error(capsys.readouterr().err, "'good' is not a step number, latest or best")


def test_readers_write_nothing_into_the_best_checkpoint_or_the_summary(val_run, capsys):
    workdir = val_run[0]
    for path, what in [
        (workdir / "best" / "r.json", "inside the run's best/"),
        (workdir / "summary.json", "the run's own summary.json"),
    ]:
        code, out, err = run_cli(capsys, "evaluate", "--workdir", workdir, "--json-file", path)
        assert code == 2 and out == ""
        one_line_error(err, what, "write nothing into the run")
    assert not (workdir / "best" / "r.json").exists()
