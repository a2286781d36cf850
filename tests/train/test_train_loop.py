"""The training loop in-process: determinism, data parallelism, accumulation, checkpoints.

All runs use small_cnn's tiny variant (or a linear model) on digits for a handful of steps,
compiled without LLVM optimizations (``FAST_COMPILE``), into a persistent compilation cache
that the resumed run reads the base run's programs back from.
"""

import json
import shutil

import numpy as np
import pytest
from flax import nnx

from layoutlab import models, nn
from layoutlab.nn import norm_onednn
from layoutlab.train.checkpoint import (
    Checkpointer,
    CorruptCheckpointError,
    IncompatibleCheckpointError,
    read_checkpoint,
)
from layoutlab.train.config import TrainConfig
from layoutlab.train.loop import train_and_evaluate

pytestmark = pytest.mark.usefixtures("shared_compiles")
# Its runs read the data-parallel train step back from the cache too (conftest's
# PARTITIONED_KEY): every run here compiles one conv plan, the table's.
CACHE_PARTITIONED = True

# Every run's programs are compiled as the loop compiles init (train.program's
# INIT_COMPILER_OPTIONS), a third less CPU time per run. What these tests check (the
# reduction order across devices, the accumulation, checkpoints and resumes) is decided in
# the HLO, which every level runs the same passes on; the level changes float32 results by
# rounding alone (no FMA contraction), identically in every run.
FAST_COMPILE = {"xla_backend_optimization_level": 0}
TINY = TrainConfig(
    model_kwargs=models.spec("small_cnn").tiny,
    batch_size=32,
    num_steps=6,
    eval_every=3,
    keep_checkpoints=2,
    xla_options=FAST_COMPILE,
)


def _train(workdir, config=TINY, **kw):
    record = train_and_evaluate(config, workdir, quiet=True, **kw)
    leaves, _ = read_checkpoint(workdir / "checkpoints")
    return record, leaves


def _assert_bitwise_equal(a: dict, b: dict):
    assert a.keys() == b.keys()
    for path in a:
        np.testing.assert_array_equal(a[path], b[path], err_msg=path)


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """TINY with seed 0 on the 4 fake devices (data parallel)."""
    workdir = tmp_path_factory.mktemp("base")
    record, leaves = _train(workdir)
    return workdir, record, leaves


def test_data_parallel_matches_one_device(base_run, tmp_path):
    _, _, sharded = base_run
    single_cfg = TrainConfig(**{**TINY.to_dict(), "data_parallel": False})
    _, single = _train(tmp_path / "single", single_cfg)
    params = [p for p in sharded if p.startswith(".params")]
    assert params
    # Split over 4 devices the gradient and BatchNorm sums are partial sums all-reduced in
    # another order than one device's reduction, so float32 rounding differs (~1e-7
    # relative per step); 6 Adam steps of lr 3e-3 amplify that to well under 1e-5.
    # The PRNG (threefry, partitionable) gives the same dropout masks on any sharding.
    for p in params:
        np.testing.assert_allclose(sharded[p], single[p], rtol=1e-4, atol=1e-5, err_msg=p)
    # The sharded run is not the single-device run bit for bit; if it were, this test
    # would not be exercising a different reduction order.
    assert any(not np.array_equal(sharded[p], single[p]) for p in params)


class _Linear(nnx.Module):
    """Flatten + Dense: no BatchNorm, no dropout, so a batch's gradient is a plain mean."""

    def __init__(self, *, num_classes, layout, policy, rngs, in_channels=1):
        del in_channels
        self.flatten = nn.Flatten(layout=layout, policy=policy)
        self.dense = nn.Dense(64, num_classes, policy=policy, rngs=rngs)

    def __call__(self, x):
        return self.dense(self.flatten(x))


@pytest.fixture
def linear_model():
    """Registered only while a test runs, so registry-wide tests never see it."""
    models.register("test_linear", description="test only: linear classifier on 8x8x1")(_Linear)
    yield "test_linear"
    models.unregister("test_linear")


def test_accumulation_equals_one_big_batch(tmp_path, linear_model):
    common = dict(
        model=linear_model,
        optimizer="sgd",
        schedule="constant",
        warmup_steps=0,
        weight_decay=0.0,
        learning_rate=0.1,
        num_steps=4,
        eval_every=2,
        data_parallel=False,
        xla_options=FAST_COMPILE,
    )
    # Micro-batches 2k and 2k+1 of 16 are batch k of 32: the epoch order does not depend on
    # the batch size, and 4 updates stay inside epoch 0.
    _, accum = _train(tmp_path / "accum", TrainConfig(**common, batch_size=16, accum_steps=2))
    _, big = _train(tmp_path / "big", TrainConfig(**common, batch_size=32, accum_steps=1))
    params = [p for p in big if p.startswith(".params")]
    # MultiSteps averages the two micro-batch means as a running mean, a different float32
    # rounding of the same mean over 32 examples: ~1e-7 relative per step, 4 steps.
    for p in params:
        np.testing.assert_allclose(accum[p], big[p], rtol=1e-5, atol=1e-6, err_msg=p)
    before = read_checkpoint(tmp_path / "big" / "checkpoints", step=2)[0]
    assert any(not np.allclose(before[p], big[p]) for p in params)  # training moved them
    # With BatchNorm the two differ for real (statistics over 16 vs 32 examples), which is
    # why this uses a model without it.


def _truncate_largest_file(step_dir):
    files = sorted((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    victim = files[-1]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    return victim


def test_corrupt_checkpoint_is_named_and_the_earlier_one_resumes(base_run, tmp_path, capsys):
    workdir, _, final = base_run
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy)
    ckpt_dir = copy / "checkpoints"
    assert sorted(int(p.name) for p in ckpt_dir.iterdir() if p.name.isdigit()) == [3, 6]
    _truncate_largest_file(ckpt_dir / "6")
    with pytest.raises(CorruptCheckpointError, match=f"Checkpoint {ckpt_dir / '6'} is corrupt"):
        read_checkpoint(ckpt_dir, step=6)
    read_checkpoint(ckpt_dir, step=3)  # the earlier one is intact

    record = train_and_evaluate(TINY, copy, resume=True, quiet=True)
    err = capsys.readouterr().err
    assert f"warning: Checkpoint {ckpt_dir / '6'} is corrupt" in err
    assert (ckpt_dir / "corrupt" / "6").is_dir()
    # Resumed from step 3 and retrained 3 -> 6: the same final state as the clean run.
    resumed, _ = read_checkpoint(ckpt_dir)
    _assert_bitwise_equal(final, resumed)
    assert record["step"] == 6
    steps = [r["step"] for r in _records(copy)]
    assert steps == [3, 6]  # the record of the lost step 6 was rewritten, not duplicated


def _records(workdir):
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_flipped_byte_is_detected(base_run, tmp_path):
    workdir, _, _ = base_run
    copy = tmp_path / "copy"
    shutil.copytree(workdir / "checkpoints", copy)
    victim = max(
        (p for p in (copy / "3").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size
    )
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match="fails its CRC-32 check"):
        read_checkpoint(copy, step=3)


def test_checkpoint_without_manifest_is_verified_by_reading(base_run, tmp_path):
    """A kill between orbax's commit and the manifest leaves a whole step without one: it is
    read when its stored arrays match its recorded shapes, and refused when they do not."""
    workdir, _, final = base_run
    copy = tmp_path / "copy"
    shutil.copytree(workdir / "checkpoints", copy)
    (copy / "6" / "layoutlab_manifest.json").unlink()
    _assert_bitwise_equal(final, read_checkpoint(copy, step=6)[0])
    _truncate_largest_file(copy / "6")
    with pytest.raises(CorruptCheckpointError, match=f"Checkpoint {copy / '6'}"):
        read_checkpoint(copy, step=6)


def test_existing_run_needs_resume(base_run):
    workdir, _, _ = base_run
    with pytest.raises(ValueError, match="already holds checkpoints.*--resume"):
        train_and_evaluate(TINY, workdir, quiet=True)


def test_resume_with_another_model_is_refused(base_run, tmp_path):
    workdir, _, _ = base_run
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy)
    wider = TrainConfig(**{**TINY.to_dict(), "model_kwargs": {"width": 8, "hidden": 16}})
    with pytest.raises(ValueError, match="with model_kwargs=.*may not change within a run"):
        train_and_evaluate(wider, copy, resume=True, quiet=True)
    # A checkpoint whose config does not say so is still refused, by its arrays' shapes.
    with Checkpointer(copy / "checkpoints") as ckpt:
        state = nnx.eval_shape(lambda: models.create("small_cnn", width=8, hidden=16))
        with pytest.raises(IncompatibleCheckpointError, match="does not match this run's"):
            ckpt.restore(6, nnx.state(state))
    # Nothing was moved aside: the checkpoints are fine, the config is not.
    with Checkpointer(copy / "checkpoints") as ckpt:
        assert ckpt.steps() == [3, 6]


def test_workdir_outputs(base_run):
    workdir, record, _ = base_run
    records = _records(workdir)
    assert [r["step"] for r in records] == [3, 6]
    keys = {"step", "epoch", "train_loss", "test_loss", "test_accuracy", "images_per_sec"}
    keys |= {"loss_scale", "skipped_steps", "elapsed", "train_accuracy"}
    assert keys <= set(records[-1])
    assert records[-1]["test_accuracy"] == record["test_accuracy"]
    assert 0.0 <= record["test_accuracy"] <= 1.0 and record["skipped_steps"] == 0
    assert (workdir / "config.json").is_file()
    assert (workdir / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A run without a validation split or keep_best: its summary has the test metrics of
    # the last record, and no best.
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["test"]["test_accuracy"] == record["test_accuracy"]
    assert (summary["step"], summary["best"], summary["stopped_early"]) == (6, None, False)


def test_pure_float16_params_train_with_float32_optimizer_state(tmp_path, linear_model):
    config = TrainConfig(
        model=linear_model,
        precision="fp16",
        num_steps=6,
        eval_every=3,
        data_parallel=False,
        xla_options=FAST_COMPILE,
    )
    record, leaves = _train(tmp_path, config)
    assert json.loads((tmp_path / "config.json").read_text())["loss_scale"] == "dynamic"
    kernel = ".params['dense']['kernel'].value"
    assert leaves[kernel].dtype == np.float16 and np.isfinite(leaves[kernel]).all()
    adam = [v for p, v in leaves.items() if p.startswith(".opt_state") and ".mu[" in p]
    assert adam and all(v.dtype == np.float32 for v in adam)
    earlier = read_checkpoint(tmp_path / "checkpoints", step=3)[0]
    assert not np.array_equal(earlier[kernel], leaves[kernel])  # float16 updates landed
    assert record["skipped_steps"] == 0 and np.isfinite(record["test_loss"])


@pytest.mark.skipif(
    norm_onednn.supports((16, 8, 8, 8), "bfloat16", True, 1e-5) is not None,
    reason="oneDNN batch normalization unavailable here",
)
def test_a_bfloat16_run_on_onednn_convs_and_batch_norms_resumes_bit_for_bit(tmp_path):
    # One device: its BatchNorms run oneDNN's primitive (a data-parallel run keeps XLA's) and
    # its convs oneDNN's, so the step holds both kinds of custom call; resumed from the step-2
    # checkpoint it ends on the uninterrupted run's bits (the same seed, the same numbers).
    # The tiny small_cnn's step holds them all (oneDNN's batch norm forward and backward, its
    # conv forward, data and weight gradients: its optimized HLO on AVX-512, 2026-12-07) in
    # half of ResNet-18's CPU time.
    run = TrainConfig(
        model="small_cnn",
        model_kwargs=models.spec("small_cnn").tiny,
        data="synthetic:8x8x3:4:64",
        precision="mixed_bf16",
        conv_algorithm="onednn",
        batch_size=16,
        num_steps=4,
        eval_every=2,
        checkpoint_every=2,
        data_parallel=False,
        xla_options=FAST_COMPILE,
    )
    _, whole = _train(tmp_path / "whole", run)
    copy = tmp_path / "resumed"
    shutil.copytree(tmp_path / "whole", copy)
    shutil.rmtree(copy / "checkpoints" / "4")  # as if killed before its last save
    record = train_and_evaluate(run, copy, resume=True, quiet=True)
    resumed, _ = read_checkpoint(copy / "checkpoints")
    assert record["step"] == 4
    _assert_bitwise_equal(whole, resumed)
