"""Per-step train metrics: ``steps.jsonl``, TensorBoard event files and ``metrics.png``.

The per-step losses are checked against the compiled train step's own outputs (recorded by a
wrapper that fetches every call, independently of the loop's batched fetches), against the
loop's per-evaluation ``train_loss`` (a separate accumulator, ``RunningMean``), and against an
uninterrupted run after a kill -9 and ``--resume`` (same seed: bitwise equal on CPU).

The runs here and the killed subprocess share one persistent compilation cache: the runs
that differ from ``BASE`` only in what they log (and the resumed one) read its programs back.
Every comparison here is between layoutlab's own programs (a step's logged loss against that
step's output, a resumed run against the uninterrupted one), so every run compiles at LLVM
level 0 (docs/development.md): the same HLO passes and fusions, less CPU per compile. The
resume reads the level from the run's config.json.
"""

import json
import struct
import subprocess
import sys

import jax
import kill_hook
import numpy as np
import pytest
from tensorboardX.proto.event_pb2 import Event

from layoutlab import cli, models
from layoutlab.train import loop
from layoutlab.train.config import TrainConfig
from layoutlab.train.loop import train_and_evaluate
from layoutlab.train.metrics import read_records
from layoutlab.train.step_log import STEPS_FILE, TENSORBOARD_DIR

pytestmark = pytest.mark.usefixtures("shared_compiles")

# The runs read the data-parallel train step back from the cache too (conftest's
# PARTITIONED_KEY): every run here compiles one conv plan, the table's.
CACHE_PARTITIONED = True

BASE = TrainConfig(
    model_kwargs=models.spec("small_cnn").tiny,
    batch_size=16,
    num_steps=8,
    eval_every=4,
    log_every=1,
    seed=3,
    xla_options={"xla_backend_optimization_level": 0},
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


def _train_recording_steps(config, workdir) -> list[dict]:
    """Trains ``config`` and returns the host metrics of every train-step call, in order."""
    calls, compile_step = [], loop.compile_train_step

    def compile_and_record(*args, **kwargs):
        step = compile_step(*args, **kwargs)

        def recorded(state, images, labels):
            state, metrics = step(state, images, labels)
            calls.append(jax.device_get(metrics))  # a sync every call: this test's only
            return state, metrics

        return recorded

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "compile_train_step", compile_and_record)
        train_and_evaluate(config, workdir, quiet=True)
    return calls


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("steps") / "run"
    return workdir, _train_recording_steps(BASE, workdir)


@pytest.fixture(scope="module")
def reference(recorded):
    return recorded[0]


def test_per_step_losses_are_the_train_steps_outputs(recorded):
    workdir, calls = recorded
    steps = read_records(workdir / STEPS_FILE)
    assert [r["step"] for r in steps] == list(range(1, 9))
    assert len(calls) == 8
    # One micro-batch per step: the logged loss is the step's float32 loss, exactly.
    for record, call in zip(steps, calls, strict=True):
        assert record["loss"] == float(call["loss"])
        assert record["accuracy"] == float(call["accuracy"])
        assert record["loss_scale"] == float(call["loss_scale"])


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


def test_every_nth_step_and_switches(reference, tmp_path):
    config = TrainConfig(**{**BASE.to_dict(), "log_every": 3, "tensorboard": False})
    train_and_evaluate(config, tmp_path / "a", quiet=True)
    every_third = read_records(tmp_path / "a" / STEPS_FILE)
    # The same run (logging changes no computation): steps 3 and 6 of the every-step log.
    assert every_third == [r for r in read_records(reference / STEPS_FILE) if r["step"] in (3, 6)]
    assert not (tmp_path / "a" / TENSORBOARD_DIR).exists()
    # All of BASE's steps, not fewer: the same programs as the reference, read from the cache.
    none = TrainConfig(**{**BASE.to_dict(), "log_every": 0})
    train_and_evaluate(none, tmp_path / "b", quiet=True)
    assert read_records(tmp_path / "b" / STEPS_FILE) == []
    # TensorBoard still gets the evaluation, and no per-step scalar.
    tags = {tag for _, tag, _ in _tensorboard_view(tmp_path / "b")}
    assert "test/accuracy" in tags and not any(t.startswith("train/") for t in tags)


def test_accumulated_steps_log_the_mean_of_their_micro_batches(tmp_path):
    # float16 compute: a dynamic loss scale, logged as the step's last micro-batch ran it.
    config = TrainConfig(
        **{**BASE.to_dict(), "accum_steps": 2, "batch_size": 8, "precision": "mixed_fp16"}
    )
    calls = _train_recording_steps(config, tmp_path)
    steps = read_records(tmp_path / STEPS_FILE)
    assert [r["step"] for r in steps] == list(range(1, 9))
    assert len(calls) == 16
    for record, pair in zip(steps, zip(calls[::2], calls[1::2], strict=True), strict=True):
        # The float64 mean of the two micro-batches' float32 losses, as computed here.
        losses = [float(c["loss"]) for c in pair]
        np.testing.assert_allclose(record["loss"], np.mean(losses), rtol=1e-15)
        assert record["loss_scale"] == float(pair[1]["loss_scale"]) > 1.0
    for record in read_records(tmp_path / "metrics.jsonl"):  # train_loss: per micro-batch mean
        window = [r["loss"] for r in steps if record["step"] - 4 < r["step"] <= record["step"]]
        np.testing.assert_allclose(np.mean(window), record["train_loss"], rtol=1e-12)


def test_logged_rates_are_the_schedule_at_each_steps_count_with_one_program(tmp_path):
    """A warmup-cosine schedule, logged in flushes of 1, 3 and 2 rows: each row's rate is the
    schedule at the count its update used, against the closed form in float64 (rtol 1e-6:
    float32's cos and products, a few ulps); and the flushes of new row counts compile no
    program after the first (evaluated eagerly, each new count of rows compiled the
    schedule's ~14 primitives again)."""
    import optax

    from layoutlab.train.step_log import StepLog
    from layoutlab.xla.cache import watch_compilation

    peak, warmup, total = 0.1, 2, 6
    schedule = optax.warmup_cosine_decay_schedule(0.0, peak, warmup, total, end_value=0.0)
    log = StepLog(tmp_path, every=1, tensorboard=False, start=0, accum_steps=1,
                  learning_rate=schedule)  # fmt: skip
    metrics = {"loss": 1.0, "accuracy": 0.5, "loss_scale": 1.0}
    log.add([metrics], 1)
    with watch_compilation() as seen:
        log.add([metrics] * 3, 4)
        log.add([metrics] * 2, 6)
    assert seen.backend_compiles == 0, seen
    rows = read_records(tmp_path / STEPS_FILE)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    for row in rows:
        count = row["step"] - 1
        if count < warmup:
            want = peak * count / warmup
        else:
            want = 0.5 * peak * (1 + np.cos(np.pi * (count - warmup) / (total - warmup)))
        np.testing.assert_allclose(row["learning_rate"], want, rtol=1e-6, atol=1e-9)


DRIVER = """
import json, sys
from layoutlab.train.config import TrainConfig
from layoutlab.train.loop import train_and_evaluate
train_and_evaluate(TrainConfig.from_dict(json.loads(sys.argv[1])), sys.argv[2], quiet=True)
"""


def test_a_resumed_run_logs_each_step_once(reference, tmp_path, capsys, env):
    workdir = tmp_path / "run"
    # Killed before the step-8 checkpoint is written: steps 5..8 were logged, the resume
    # restarts at 4 and logs them again.
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(BASE.to_dict()), str(workdir)],
        env=kill_hook.environ("before_save@8", env),
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
