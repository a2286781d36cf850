"""Augmentation and regularization in training (``train.batch_augment``): soft-target loss
against float64 NumPy, draws that follow the seed and the step, a mixup run resumed bit for
bit, and one ``error:`` line for every bad setting."""

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from cli_helpers import one_line_error, run_cli

from layoutlab import models
from layoutlab.train.batch_augment import image_augment, soft_targets
from layoutlab.train.checkpoint import read_checkpoint
from layoutlab.train.config import TrainConfig, validate
from layoutlab.train.loop import train_and_evaluate
from layoutlab.train.program import INIT_COMPILER_OPTIONS
from layoutlab.train.spec import InputSpec, resolve_spec
from layoutlab.train.steps import cross_entropy

pytestmark = pytest.mark.usefixtures("shared_compiles")
# Its runs read the data-parallel train step back from the cache too (conftest's
# PARTITIONED_KEY): every run here compiles one conv plan, the table's.
CACHE_PARTITIONED = True


def _numpy_cross_entropy(logits, targets):
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return float(-(targets * log_p).sum(axis=-1).mean())


def test_label_smoothing_loss_against_float64_numpy():
    rng = np.random.default_rng(0)
    logits = (3 * rng.standard_normal((16, 10))).astype(np.float32)
    labels = rng.integers(0, 10, 16).astype(np.int32)
    eps = 0.1
    targets = optax.smooth_labels(jax.nn.one_hot(labels, 10), eps)
    want_targets = np.full((16, 10), eps / 10) + (1 - eps) * np.eye(10)[labels]
    np.testing.assert_allclose(np.asarray(targets), want_targets, rtol=0, atol=1e-7)
    got = float(cross_entropy(jnp.asarray(logits), targets))
    # A float32 log-softmax of logits of size ~10, averaged over 16 rows: ~1e-6 relative.
    np.testing.assert_allclose(got, _numpy_cross_entropy(logits, want_targets), rtol=1e-5)
    # Integer labels are the eps=0 case.
    hard = float(cross_entropy(jnp.asarray(logits), jnp.asarray(labels)))
    np.testing.assert_allclose(hard, _numpy_cross_entropy(logits, np.eye(10)[labels]), rtol=1e-5)


# CutMix and auto-augmentation are left to tests/data (their draws follow the key alike):
# each adds seconds of compile to every program here.
CONFIG = dict(augment=True, random_erasing=0.5, mixup=0.2, label_smoothing=0.1)


def test_one_seed_draws_one_batch_and_another_seed_another():
    rng = np.random.default_rng(0)
    images = rng.standard_normal((8, 8, 8, 1)).astype(np.float32)
    labels = rng.integers(0, 10, 8).astype(np.int32)
    inputs = InputSpec((8, 8, 1), 10, 8, pixel_stats=((0.5,), (0.25,)))

    def pipelines(key):
        out = []
        for seed in (0, 1):
            spec = resolve_spec(TrainConfig(seed=seed, **CONFIG))
            x = image_augment(spec, inputs)(key, jnp.asarray(images))
            out.append(soft_targets(spec, inputs)(key, x, jnp.asarray(labels)))
        return out

    run = jax.jit(pipelines).lower(jax.random.key(0)).compile(INIT_COMPILER_OPTIONS)
    step = jax.random.fold_in(jax.random.key(0), 5)  # the train step's key at step 5
    first, again = run(step), run(step)
    for a, b in zip(jax.tree.leaves(first[0]), jax.tree.leaves(again[0]), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(first[0][0]), np.asarray(first[1][0]))  # seed 1
    later = run(jax.random.fold_in(jax.random.key(0), 6))
    assert not np.array_equal(np.asarray(first[0][0]), np.asarray(later[0][0]))  # step 6
    images_out, targets, counted = (np.asarray(a) for a in first[0])
    np.testing.assert_allclose(targets.sum(axis=1), 1.0, rtol=0, atol=1e-6)
    # The train accuracy's labels: each image's dominant one, the targets' argmax.
    np.testing.assert_array_equal(counted, targets.argmax(axis=1))


def _truncate_largest_file(step_dir):
    victim = max((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])


def test_a_mixup_run_resumes_bit_for_bit(tmp_path):
    config = TrainConfig(
        model_kwargs=models.spec("small_cnn").tiny, batch_size=32, num_steps=4, eval_every=2,
        xla_options=INIT_COMPILER_OPTIONS, tensorboard=False, mixup=0.2, label_smoothing=0.1,
    )  # fmt: skip
    train_and_evaluate(config, tmp_path / "a", quiet=True)
    whole, _ = read_checkpoint(tmp_path / "a" / "checkpoints")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    _truncate_largest_file(tmp_path / "b" / "checkpoints" / "4")  # resumes from step 2
    train_and_evaluate(config, tmp_path / "b", resume=True, quiet=True)
    resumed, _ = read_checkpoint(tmp_path / "b" / "checkpoints")
    assert whole.keys() == resumed.keys()
    for path in whole:
        np.testing.assert_array_equal(resumed[path], whole[path], err_msg=path)
    before = read_checkpoint(tmp_path / "a" / "checkpoints", step=2)[0]
    assert any(not np.array_equal(before[p], whole[p]) for p in whole if "params" in p)


def test_a_policy_has_one_spelling():
    for text, want in [
        ("RAND", "rand-m10-n2"),
        ("rand-n3-m9", "rand-m9-n3"),
        (" Trivial", "trivial"),
    ]:
        assert validate(TrainConfig(auto_augment=text), 1).auto_augment == want


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--mixup", "-0.5"], "mixup is the alpha of Beta(alpha, alpha)"),
        (["--cutmix", "nan"], "cutmix is the alpha"),
        (["--mixup", "1e300"], "mixup=1e+300 overflows float32"),
        (["--random-erasing", "1.5"], "random_erasing is a probability in [0, 1]"),
        (["--label-smoothing", "1"], "label_smoothing must be in [0, 1)"),
        (["--label-smoothing", "-0.1"], "label_smoothing must be in [0, 1)"),
        (["--auto-augment", "autoaugment"], "Unknown auto_augment 'autoaugment'"),
        (["--auto-augment", "rand-m11-n2"], "magnitude m11 is above 10"),
        (["--auto-augment", "rand-m9-mstd0.5"], "'mstd0.5' is not mM or nN"),
        (["--set", "random_erasing_mode=noise"], "Unknown random_erasing_mode 'noise'"),
        (["--model", "unet", "--mixup", "0.2"], "predicts a label per pixel"),
        (["--model", "small_cnn3d", "--auto-augment", "trivial"], "takes 3D inputs"),
    ],
)
def test_bad_settings_are_one_error_line(tmp_path, capsys, argv, fragment):
    code, _, err = run_cli(capsys, "train", "--workdir", tmp_path / "w", *argv)
    assert code == 2
    one_line_error(err, fragment)
    assert not (tmp_path / "w").exists()
