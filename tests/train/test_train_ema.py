"""The moving average of the weights (--ema-decay) in the train step, the loop, checkpoints,
resume and the readers (evaluate --weights ema); and the one-line errors of the recipe flags
(schedule, clipping, EMA)."""

import json
import shutil

import jax
import numpy as np
import pytest
from cli_helpers import one_line_error, run_cli

from layoutlab import models
from layoutlab.data import train_batches
from layoutlab.infer.evaluate import evaluate_workdir
from layoutlab.train.checkpoint import read_checkpoint
from layoutlab.train.config import TrainConfig, validate
from layoutlab.train.loop import train_and_evaluate
from layoutlab.train.program import build_program
from layoutlab.train.run_data import load_run_data
from layoutlab.train.spec import InputSpec, resolve_spec

pytestmark = pytest.mark.usefixtures("shared_compiles")
# Its runs read the data-parallel train step back from the cache too (conftest's
# PARTITIONED_KEY): every run here compiles one conv plan, the table's.
CACHE_PARTITIONED = True

TINY = models.spec("small_cnn").tiny
FAST_COMPILE = {"xla_backend_optimization_level": 0}  # as test_train_loop.py's runs


def _floats(tree) -> list[np.ndarray]:
    leaves = jax.tree.leaves(tree)
    return [np.asarray(x, np.float64) for x in leaves if jax.numpy.issubdtype(x.dtype, np.floating)]


def _assert_average(ema, old, new, decay):
    # Reference in float64: decay * old + (1 - decay) * new. The step computes it in float32
    # (two products and a sum): within an ulp or two of each value.
    for got, o, n in zip(_floats(ema), _floats(old), _floats(new), strict=True):
        np.testing.assert_allclose(got, decay * o + (1 - decay) * n, rtol=1e-6, atol=1e-8)


def _assert_same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = (jax.random.key_data(v) if jax.dtypes.issubdtype(v.dtype, jax.dtypes.prng_key)
                else v for v in (x, y))  # fmt: skip
        np.testing.assert_array_equal(x, y)


def test_the_ema_moves_once_per_optimizer_step_and_not_on_a_skipped_step():
    config = validate(
        TrainConfig(model_kwargs=TINY, batch_size=8, accum_steps=2, ema_decay=0.75), 1
    )
    dataset = load_run_data(config)
    program = build_program(resolve_spec(config, 10), InputSpec.of(dataset, 8), "cpu")
    step = jax.jit(program.train_step, compiler_options=FAST_COMPILE)
    batches = list(train_batches(dataset, 8, layout="NHWC", seed=0, start_step=0, num_steps=4))
    s0 = jax.jit(program.init, compiler_options=FAST_COMPILE)()
    _assert_same(s0.ema, (s0.params, s0.model_state))  # it starts from the weights
    s1, _ = step(s0, *batches[0])
    _assert_same(s1.ema.params, s0.ema.params)  # mid-accumulation: no optimizer step yet
    nan_images = np.full_like(batches[1][0], np.nan)
    s1b, metrics = step(s1, nan_images, batches[1][1])
    assert not bool(metrics["grads_finite"])
    _assert_same(s1b.ema.params, s1.ema.params)  # skipped: left bit for bit
    _assert_same(s1b.ema.model_state, s1.ema.model_state)
    s2, _ = step(s1b, *batches[1])  # completes optimizer step 1
    assert not np.array_equal(_floats(s2.params)[0], _floats(s0.params)[0])
    _assert_average(s2.ema.params, s0.ema.params, s2.params, 0.75)
    # BatchNorm's running statistics are averaged too (timm's ModelEmaV2 averages buffers).
    _assert_average(s2.ema.model_state, s0.ema.model_state, s2.model_state, 0.75)
    s3, _ = step(s2, *batches[2])
    s4, _ = step(s3, *batches[3])  # optimizer step 2
    _assert_same(s3.ema.params, s2.ema.params)
    _assert_average(s4.ema.params, s2.ema.params, s4.params, 0.75)


# Saves at 2, 4 and 6, evaluations at 3 and 6; the "killed" copy keeps only step 2. Data
# parallel on the 4 fake devices: the EMA is sharded as the params are.
RUN = TrainConfig(
    model_kwargs=TINY,
    batch_size=32,
    num_steps=6,
    eval_every=3,
    checkpoint_every=2,
    schedule="cosine",
    min_lr=1e-4,
    ema_decay=0.9,
    seed=3,
    tensorboard=False,
    xla_options=FAST_COMPILE,
)


def _records(workdir):
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    timing = ("images_per_sec", "elapsed")
    return [{k: v for k, v in json.loads(line).items() if k not in timing} for line in lines]


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("ema") / "run"
    record = train_and_evaluate(RUN, workdir, quiet=True)
    return workdir, record


def test_a_killed_and_resumed_ema_cosine_run_ends_bitwise_equal(ema_run, tmp_path, capsys):
    workdir, _ = ema_run
    killed = tmp_path / "killed"
    shutil.copytree(workdir, killed)
    for step in ("4", "6"):  # as a kill right after step 2's save leaves it
        shutil.rmtree(killed / "checkpoints" / step)
    train_and_evaluate(RUN, killed, resume=True)
    # The line that says what will run: 5% of 6 steps rounds to no warmup.
    assert "\nschedule: cosine 0.003 -> 0.0001 over 6 steps\n" in capsys.readouterr().out
    want, _ = read_checkpoint(workdir / "checkpoints")
    got, _ = read_checkpoint(killed / "checkpoints")
    assert want.keys() == got.keys()
    assert any(path.startswith(".ema.params") for path in want)
    for path in want:
        np.testing.assert_array_equal(got[path], want[path], err_msg=path)
    assert _records(killed) == _records(workdir)


def test_evaluation_reports_the_ema_and_the_readers_take_it(ema_run, capsys):
    workdir, record = ema_run
    final, _ = read_checkpoint(workdir / "checkpoints")
    kernel = ".params['classifier']['layers'][3]['kernel'].value"
    assert not np.array_equal(final[".ema" + kernel], final[kernel])
    # The readers run the loop's eval step: the run's own figures, bit for bit.
    ema = evaluate_workdir(workdir, weights="ema")
    assert (ema["test_loss"], ema["test_accuracy"]) == (
        record["ema_test_loss"],
        record["ema_test_accuracy"],
    )
    raw = evaluate_workdir(workdir)
    assert raw["test_loss"] == record["test_loss"] != record["ema_test_loss"]
    code, out, _ = run_cli(capsys, "evaluate", "--workdir", workdir, "--weights", "ema", "--json")
    assert code == 0 and json.loads(out)["test_loss"] == record["ema_test_loss"]


def test_weights_ema_of_a_run_without_ema_is_one_error_line(guarantees_run, tmp_path, capsys):
    out = str(tmp_path / "model.jax")
    for command in (["evaluate"], ["predict", str(guarantees_run)], ["export", "--out", out]):
        code, _, err = run_cli(capsys, *command, "--workdir", guarantees_run, "--weights", "ema")
        assert code == 2
        one_line_error(err, "trained without a moving average", "--weights raw")


_STEPS = ["--steps", "4", "--batch-size", "32", "--set", "model_kwargs.width=4"]


@pytest.mark.parametrize(
    "flags,fragment",
    [
        (["--min-lr=-1e-3"], "min_lr must be a finite number >= 0"),
        (["--min-lr", "nan"], "min_lr must be a finite number >= 0, got nan"),
        (["--min-lr", "0.1", "--lr", "0.01"], "min_lr=0.1 is above learning_rate=0.01"),
        (["--schedule", "step"], "schedule='step' needs the epochs to decay at"),
        (["--schedule", "step", "--lr-decay-epochs", "0.06,0.03"], "strictly increasing"),
        (["--schedule", "step", "--lr-decay-epochs", "0.05,9"], "epoch 9 (optimizer step"),
        # 44 batches an epoch: 0.05 epoch is 2 steps, 0.02 and 0.03 are both step 1.
        (
            ["--schedule", "step", "--lr-decay-epochs", "0.03", "--warmup-epochs", "0.05"],
            "is inside the warmup (2 steps)",
        ),
        (
            ["--schedule", "step", "--warmup-steps", "0", "--lr-decay-epochs", "0.02,0.03"],
            "falls on optimizer step 1",
        ),  # fmt: skip
        (["--lr-decay-epochs", "1"], "applies to schedule='step' only"),
        (["--lr-decay-rate", "0"], "lr_decay_rate must be a finite number > 0"),
        (["--lr-decay-rate", "2"], "lr_decay_rate must be in (0, 1]"),
        (["--clip-grad-norm", "0"], "clip_grad_norm must be a finite number > 0"),
        (["--clip-grad-norm=-1"], "clip_grad_norm must be a finite number > 0"),
        (["--ema-decay", "1"], "ema_decay must be a finite number >= 0 and < 1"),
        (["--ema-decay=-0.5"], "ema_decay must be a finite number >= 0 and < 1"),
        (["--warmup-epochs", "1", "--warmup-steps", "2"], "both set the warmup"),
        (["--warmup-epochs", "10"], "is as long as the whole run (4 optimizer steps)"),
        (["--warmup-steps", "4"], "warmup_steps=4 is as long as the whole run"),
    ],
)
def test_bad_recipe_values_are_one_error_line(tmp_path, capsys, flags, fragment):
    workdir = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", *_STEPS, "--workdir", workdir, "--quiet", *flags)
    assert code == 2
    one_line_error(err, fragment)
    assert not workdir.exists()


@pytest.mark.parametrize(
    "flags,field",
    [
        (["--ema-decay", "0.9"], "ema_decay"),
        (["--clip-grad-norm", "1"], "clip_grad_norm"),
        (["--min-lr", "1e-5"], "min_lr"),
        (["--warmup-epochs", "0.01"], "warmup_epochs"),
        (["--schedule", "constant"], "schedule"),
    ],
)
def test_resume_refuses_a_changed_recipe(copy, capsys, flags, field):
    code, _, err = run_cli(capsys, "train", "--workdir", copy, "--resume", "--quiet", *flags)
    assert code == 2
    one_line_error(err, f"with {field}=", "may not change within a run")
