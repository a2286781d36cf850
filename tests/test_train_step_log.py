"""Per-step train metrics: ``steps.jsonl``, TensorBoard event files and ``metrics.png``.

The per-step losses are checked against the loop's per-evaluation ``train_loss``, which a
separate accumulator (``RunningMean``) computes from the same fetched values, and against an
uninterrupted run after a kill -9 and ``--resume`` (same seed: bitwise equal on CPU).
"""

import json
import struct
import subprocess
import sys

import numpy as np
import pytest
from tensorboardX.proto.event_pb2 import Event

from layoutlab import cli, models
from layoutlab.train.checkpoint import KILL_HOOK_ENV
from layoutlab.train.config import TrainConfig
from layoutlab.train.loop import train_and_evaluate
from layoutlab.train.metrics import read_records
from layoutlab.train.step_log import STEPS_FILE, TENSORBOARD_DIR

BASE = TrainConfig(
    model_kwargs=models.spec("small_cnn").tiny,
    batch_size=16,
    num_steps=8,
    eval_every=4,
    log_every=1,
    seed=3,
)


def _events(path):
    """``(step, tag, value)`` of every scalar in a TFRecord event file, plus the purge
    markers as ``(step, "purge", None)`` (framing: u64 length, u32 crc, data, u32 crc)."""
    data, out, at = path.read_bytes(), [], 0
    while at < len(data):
        (length,) = struct.unpack("<Q", data[at : at + 8])
        event = Event.FromString(data[at + 12 : at + 12 + length])
        at += 12 + length + 4
        if event.HasField("session_log"):
            out.append((event.step, "purge", None))
        for value in event.summary.value:
            out.append((event.step, value.tag, value.simple_value))
    return out


def _tensorboard_view(workdir):
    """Scalars as TensorBoard shows them: files in order, each purge marker hides the
    earlier events at or after its step."""
    shown = []
    for path in sorted((workdir / TENSORBOARD_DIR).iterdir(), key=lambda p: p.stat().st_mtime):
        for step, tag, value in _events(path):
            if tag == "purge":
                shown = [e for e in shown if e[0] < step]
            else:
                shown.append((step, tag, value))
    return shown


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("steps") / "run"
    train_and_evaluate(BASE, workdir, quiet=True)
    return workdir


def test_per_step_losses_agree_with_the_per_eval_means(reference):
    steps = read_records(reference / STEPS_FILE)
    assert [r["step"] for r in steps] == list(range(1, 9))
    evals = read_records(reference / "metrics.jsonl")
    for record in evals:
        window = [r["loss"] for r in steps if record["step"] - 4 < r["step"] <= record["step"]]
        # Both are float64 means of the same float32 losses, summed in another order.
        np.testing.assert_allclose(np.mean(window), record["train_loss"], rtol=1e-12)
    # The cosine schedule with 5% warmup (0 steps of 8): the first update uses the peak rate.
    assert steps[0]["learning_rate"] == pytest.approx(BASE.learning_rate, rel=1e-6)
    assert steps[-1]["learning_rate"] < steps[0]["learning_rate"]
    assert all(r["loss_scale"] == 1.0 for r in steps)  # fp32: no scaling


def test_tensorboard_holds_the_same_scalars(reference):
    shown = _tensorboard_view(reference)
    losses = {step: value for step, tag, value in shown if tag == "train/loss"}
    steps = read_records(reference / STEPS_FILE)
    assert sorted(losses) == [r["step"] for r in steps]
    for r in steps:  # TensorBoard stores float32
        assert losses[r["step"]] == np.float32(r["loss"])
    test_acc = [(s, v) for s, tag, v in shown if tag == "test/accuracy"]
    evals = read_records(reference / "metrics.jsonl")
    assert test_acc == [(r["step"], np.float32(r["test_accuracy"])) for r in evals]
    assert (reference / "metrics.png").read_bytes()[:4] == b"\x89PNG"


def test_every_nth_step_and_switches(tmp_path):
    config = TrainConfig(**{**BASE.to_dict(), "log_every": 3, "tensorboard": False})
    train_and_evaluate(config, tmp_path / "a", quiet=True)
    assert [r["step"] for r in read_records(tmp_path / "a" / STEPS_FILE)] == [3, 6]
    assert not (tmp_path / "a" / TENSORBOARD_DIR).exists()
    none = TrainConfig(**{**BASE.to_dict(), "log_every": 0, "num_steps": 2})
    train_and_evaluate(none, tmp_path / "b", quiet=True)
    assert read_records(tmp_path / "b" / STEPS_FILE) == []


def test_accumulated_steps_log_the_mean_of_their_micro_batches(tmp_path):
    config = TrainConfig(**{**BASE.to_dict(), "accum_steps": 2, "batch_size": 8})
    train_and_evaluate(config, tmp_path, quiet=True)
    steps = read_records(tmp_path / STEPS_FILE)
    assert [r["step"] for r in steps] == list(range(1, 9))
    for record in read_records(tmp_path / "metrics.jsonl"):  # train_loss: per micro-batch mean
        window = [r["loss"] for r in steps if record["step"] - 4 < r["step"] <= record["step"]]
        np.testing.assert_allclose(np.mean(window), record["train_loss"], rtol=1e-12)


DRIVER = """
import json, sys
from layoutlab.train.config import TrainConfig
from layoutlab.train.loop import train_and_evaluate
train_and_evaluate(TrainConfig.from_dict(json.loads(sys.argv[1])), sys.argv[2], quiet=True)
"""


def test_a_resumed_run_logs_each_step_once(reference, tmp_path, capsys):
    workdir = tmp_path / "run"
    # Killed before the step-8 checkpoint is written: steps 5..8 were logged, the resume
    # restarts at 4 and logs them again.
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(BASE.to_dict()), str(workdir)],
        env={**__import__("os").environ, KILL_HOOK_ENV: "before_save@8"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -9, proc.stderr
    assert cli.main(["train", "--workdir", str(workdir), "--resume", "--quiet"]) == 0
    capsys.readouterr()
    want = read_records(reference / STEPS_FILE)
    assert read_records(workdir / STEPS_FILE) == want  # once each, bitwise as uninterrupted
    losses = [(s, v) for s, tag, v in _tensorboard_view(workdir) if tag == "train/loss"]
    assert losses == [(r["step"], np.float32(r["loss"])) for r in want]
