"""A run whose loss goes non-finite and stays so stops with one line and exit code 2,
recording and saving nothing from there on (``train.divergence``); ``predict`` never prints
NaN probabilities as an answer (docs/guides/guarantees.md).

The CLI is driven in-process through ``layoutlab.cli.main``; the runs are the tiny small_cnn
on digits, where ``--lr 1e30`` makes the first update blow the parameters up, so that every
later step's loss is NaN and skipped.
"""

import json
import re

import numpy as np
import pytest
from cli_helpers import one_line_error as _one_line_error
from cli_helpers import run_cli as _cli
from PIL import Image

from layoutlab.data import get_dataset
from layoutlab.train import divergence
from layoutlab.train.divergence import DivergedError, Divergence

pytestmark = pytest.mark.usefixtures("shared_compiles")

# Runs checked for their refusals and files, not their numbers: LLVM level 0
# (docs/development.md). Where a loss turns non-finite does not hang on a rounding: 1e30 steps.
TINY = ["--tiny", "--quiet", "--batch-size", "16"]
TINY += ["--xla-option", "xla_backend_optimization_level=0"]


def _steps(workdir):
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def _records(workdir):
    path = workdir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _digit_png(path):
    dataset = get_dataset("digits")
    raw = dataset.test_images[0, ..., 0] * dataset.std[0] + dataset.mean[0]
    Image.fromarray(np.clip(np.round(raw * 255), 0, 255).astype(np.uint8)).save(path)
    return path


def test_a_run_with_a_non_finite_eval_stops_and_saves_nothing_after(tmp_path, capsys):
    workdir = tmp_path / "run"
    code, out, err = _cli(
        capsys, "train", "--workdir", workdir, *TINY, "--steps", "20",
        "--set", "checkpoint_every=5", "--set", "eval_every=20", "--lr", "1e30",
    )  # fmt: skip
    assert code == 2
    _one_line_error(
        err, "training diverged", "test loss at step 20 is nan", "without recording or saving",
        "newest checkpoint, step 15", "lower --lr", "--resume keeps",
    )  # fmt: skip
    assert "outputs in" not in out
    assert _steps(workdir) == [5, 10, 15] and _records(workdir) == []
    # The checkpoints kept are the run's up to then; their model gives no answer either.
    code, out, err = _cli(capsys, "predict", "--workdir", workdir, _digit_png(tmp_path / "d.png"))
    assert code == 2 and out == ""
    _one_line_error(err, "step 15 gives non-finite outputs", "1 of 1 images", "diverged")


def test_a_run_that_skips_every_step_stops_before_its_next_checkpoint(
    tmp_path, capsys, monkeypatch
):
    # 5 instead of 50 keeps the run short; the loop sees every fetch the same way.
    monkeypatch.setattr(divergence, "MAX_SKIPPED_IN_A_ROW", 5)
    # It is handed the metrics the loop fetched already (host values): no sync of its own.
    handed, add = [], Divergence.add
    monkeypatch.setattr(Divergence, "add", lambda self, f, m: handed.extend(f) or add(self, f, m))
    workdir = tmp_path / "run"
    code, _, err = _cli(
        capsys, "train", "--workdir", workdir, *TINY, "--steps", "40", "--set", "weight_decay=1e30",
        "--set", "checkpoint_every=5", "--set", "eval_every=40",
    )  # fmt: skip
    assert code == 2
    # The first steps are finite (the warmup's rate is small at first; then the decay blows
    # the parameters up): fewer than 5 of steps 1-5 are skipped, so step 5 is saved; the
    # fetch before step 10's checkpoint finds 5 or more in a row since, and stops.
    line = _one_line_error(
        err, "training diverged", "stopped at step 10 without saving it",
        "newest checkpoint, step 5", "lower --lr",
    )  # fmt: skip
    count, first = map(
        int, re.search(r"last (\d+) batches in a row \(steps (\d+)-10", line).groups()
    )
    assert count == 10 - first + 1 and 5 <= count < 9 and "train loss nan" in line
    assert _steps(workdir) == [5] and _records(workdir) == []
    assert len(handed) == 10 and all(type(m["loss"]) is np.ndarray for m in handed)


def _metrics(*finite):
    return [{"grads_finite": np.bool_(f), "loss": np.float32(1 if f else np.nan)} for f in finite]


def test_divergence_counts_skipped_batches_in_a_row_across_fetches(monkeypatch):
    monkeypatch.setattr(divergence, "MAX_SKIPPED_IN_A_ROW", 4)
    watch = Divergence(2, lambda: None)  # 2 batches per optimizer step
    watch.add(_metrics(True, False, False, True), 4)  # a finite batch ends a streak
    watch.add(_metrics(False, False, False), 7)  # batches 5-7: 3 in a row, steps 3-4
    with pytest.raises(DivergedError, match=r"last 4 batches in a row \(steps 3-4,") as e:
        watch.add(_metrics(False), 8)
    assert "it has no checkpoint" in str(e.value)
    # A finite test loss passes; a non-finite one is refused, whatever the train loss.
    watch = Divergence(1, lambda: 3, loss_scaled=True)
    watch.check_eval({"step": 4, "test_loss": 0.5, "train_loss": float("nan")})
    with pytest.raises(DivergedError, match="test loss at step 6 is inf.*or loss scale"):
        watch.check_eval({"step": 6, "test_loss": float("inf")})
