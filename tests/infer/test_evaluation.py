"""``evaluate`` splits the test split into batches of one shape, pads the last one, and counts
every image once: its metrics against the same model's logits for the whole split in one
call, reduced in float64 by NumPy.

small_cnn's tiny variant at its initial weights on digits (359 test images, a prime, so no
batch size divides it), on one device and split over conftest's 4 fake CPU devices.
"""

import dataclasses
import json
import math

import jax
import numpy as np
import pytest

from layoutlab import models
from layoutlab.data import get_dataset
from layoutlab.infer.evaluate import evaluate_run, on_current_eval_plan
from layoutlab.infer.load import open_run
from layoutlab.nn.conv_algos import ConvPlan
from layoutlab.train import program as programs
from layoutlab.train.config import TrainConfig, validate
from layoutlab.train.evaluation import eval_batches, eval_sums, record_metrics, run_eval_batch
from layoutlab.train.loop import train_and_evaluate
from layoutlab.train.run_plan import abstract_model, current_eval_plan, planned
from layoutlab.train.sharding import make_shardings
from layoutlab.train.spec import InputSpec, resolve_spec
from layoutlab.xla.inspect import inspect_spec


@pytest.mark.parametrize("devices", [1, 2, 4, 8])
def test_eval_batches_are_the_fewest_of_one_shape_that_hold_every_image(devices):
    for size in {devices, 3 * devices, 64, 512}:
        for count in [1, 2, 7, 63, 64, 65, 359, 511, 512, 513, 1000, 10_000]:
            steps, batch = eval_batches(count, size, devices)
            assert steps == math.ceil(count / size), (count, size)  # as few as full batches
            assert batch <= size and batch % devices == 0, (count, size, batch)
            assert (steps - 1) * batch < count <= steps * batch, (count, size, steps, batch)
            assert steps * batch - count < steps * devices, (count, size, steps, batch)
    assert eval_batches(0, 512, 4) == (0, 0)
    assert eval_batches(10_000, 512) == (20, 500)  # CIFAR-10: no padding at all
    assert eval_batches(359, 512, 4) == (1, 360)


@pytest.mark.parametrize("devices", [2, 4])
def test_eval_batches_of_a_size_no_multiple_of_the_devices_match_the_loaders_cut(devices):
    # `evaluate --batch-size 7` on 4 devices: batches of 8, and exactly as many as cutting the
    # split at 8 makes, so the last one (the one padded) is the loader's last.
    for size in (devices + 1, 3 * devices - 1):
        for count in [1, 7, 63, 359, 1000]:
            steps, batch = eval_batches(count, size, devices)
            assert batch % devices == 0 and batch < size + devices, (count, size, batch)
            assert steps == math.ceil(count / batch), (count, size, steps, batch)
    assert eval_batches(359, 7, 4) == (45, 8)


@pytest.fixture(scope="module")
def digits_program():
    dataset = get_dataset("digits")
    config = validate(TrainConfig(model_kwargs=models.spec("small_cnn").tiny), 1)
    program = programs.build_program(resolve_spec(config), InputSpec.of(dataset, 32), "cpu")
    config = program.spec.config  # resolved
    state = jax.jit(program.init)()
    images, labels = dataset.split("test")
    logits = np.asarray(jax.jit(program.forward)(state, images), np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    losses = np.log(np.exp(shifted).sum(axis=1)) - shifted[np.arange(labels.size), labels]
    predicted = logits.argmax(axis=1)
    confusion = np.zeros((10, 10), np.int64)
    np.add.at(confusion, (labels, predicted), 1)
    # The 5 highest logits, ties to the lower class (a stable sort of the negated logits).
    top5 = np.argsort(-logits, axis=1, kind="stable")[:, :5]
    want = {
        "loss": losses.mean(),
        "correct": int((predicted == labels).sum()),
        "confusion": confusion,
        "top5_correct": int((top5 == labels[:, None]).any(axis=1).sum()),
    }
    return dataset, config, program, state, want


@pytest.mark.parametrize("data_parallel", [False, True])
@pytest.mark.parametrize("eval_batch_size", [64, 100, 512])
def test_evaluate_counts_every_image_once_in_batches_of_one_shape(
    digits_program, data_parallel, eval_batch_size
):
    dataset, config, program, state, want = digits_program
    config = TrainConfig(
        **{**config.to_dict(), "eval_batch_size": eval_batch_size, "data_parallel": data_parallel}
    )
    shard = make_shardings(data_parallel)
    assert shard.num_devices == (4 if data_parallel else 1)
    spec = resolve_spec(config, num_devices=shard.num_devices)
    shapes = []

    def eval_step(state, images, labels):
        shapes.append((images.shape, labels.shape))
        for x in (images, labels):  # every batch split over the devices, the last one too
            assert x.sharding.is_equivalent_to(shard.batch, x.ndim), x.sharding
        return jitted(state, images, labels)

    jitted = jax.jit(program.eval_step, out_shardings=shard.replicated)
    sums = eval_sums(eval_step, jax.device_put(state, shard.replicated), dataset, spec, shard)
    got = record_metrics(sums)

    steps, batch = eval_batches(359, eval_batch_size, shard.num_devices)
    assert batch == run_eval_batch(dataset, spec, shard.num_devices)
    # Padding rows: 1 at 64 and 100 on one device, 1, 9 and 1 on four; none at 512 alone.
    padding = {(64, 1): 1, (100, 1): 1, (512, 1): 0, (64, 4): 1, (100, 4): 9, (512, 4): 1}
    assert steps * batch - 359 == padding[eval_batch_size, shard.num_devices]
    assert len(shapes) == steps and set(shapes) == {((batch, 8, 8, 1), (batch,))}
    # Accuracy is a count: exact. The loss: float32 per-image losses summed in float32 over
    # at most 512 of them, against float64 on the same logits from one call on all 359
    # images; measured 2e-8 relative, and 1e-5 is still 100x below one image's share of the
    # mean (a padding row counted, or an image lost, moves it by about 1/359).
    assert got["test_accuracy"] == want["correct"] / 359
    np.testing.assert_allclose(got["test_loss"], want["loss"], rtol=1e-5)
    # The extras `layoutlab evaluate` reports come from the same sums: counts, so exact.
    np.testing.assert_array_equal(sums["confusion"], want["confusion"])
    assert sums["top5_correct"] == want["top5_correct"]


@pytest.mark.parametrize(
    ("model", "classes", "layout"),
    [("small_cnn", 5, "NHWC"), ("small_cnn", 6, "NCHW"), ("unet", 3, "NCHW"), ("unet", 7, "NHWC")],
)
def test_the_eval_step_sums_a_confusion_matrix_and_top5_hits_past_5_classes(model, classes, layout):
    # Shapes only (no compile): a segmentation model's per-pixel labels, with its classes on
    # the layout's channel axis, fill the same classes x classes matrix.
    tiny = models.spec(model).tiny
    spec, inputs = inspect_spec(model, layout=layout, batch_size=4, image_size=8,
                                num_classes=classes, model_kwargs=tiny)  # fmt: skip
    program = programs.build_program(spec, inputs, "cpu")
    state = jax.eval_shape(program.init)
    sums = jax.eval_shape(program.eval_step, state, *inputs.batch(spec.layout))
    keys = {"loss_sum", "correct", "count", "confusion"}
    keys |= {"top5_correct"} if classes > 5 else set()
    assert set(sums) == keys
    assert sums["confusion"].shape == (classes, classes)
    assert all(sums[k].shape == () for k in keys - {"confusion"})


def _batches(plan) -> set[str]:
    """The batches a conv plan's entries (a ``ConvPlan`` or its JSON) were made for (``n16``
    ...)."""
    return {e.spec_key.split(":")[1] for _, e in ConvPlan.from_dict(plan).items()}


def test_an_eval_plan_for_another_batch_is_made_again_for_this_one():
    dataset = get_dataset("digits")
    spec = resolve_spec(validate(TrainConfig(model_kwargs=models.spec("small_cnn").tiny), 1))
    inputs = InputSpec.of(dataset, 32)
    model = abstract_model(spec, inputs)
    at_16 = planned(spec, inputs, 1, None, None, model, 16)
    assert _batches(at_16.config.eval_conv_plan) == {"n16"}
    layout = spec.layout
    images_16, images_40 = (inputs.batch(layout, n)[0] for n in (16, 40))
    # It fits the batch it was made for: kept as it is.
    assert current_eval_plan(at_16, model, images_16) is at_16.config.eval_conv_plan
    # At 40 none of its entries fits: what planning at 40 makes instead of it.
    again = current_eval_plan(at_16, model, images_40)
    assert again == planned(spec, inputs, 1, None, None, model, 40).config.eval_conv_plan
    assert _batches(again) == {"n40"}
    # A run that stores none (a given conv_plan, or one from before eval plans) keeps none.
    bare = at_16.with_plan(at_16.conv_plan, None)
    assert current_eval_plan(bare, model, images_40) is None


def test_a_resume_at_another_eval_batch_replans_evaluation_and_evaluate_follows(tmp_path):
    # Under conftest's 4 devices: eval batch 512 holds digits' 359 test images as one batch
    # of 360; at eval_batch_size 64 they are 6 batches of 60.
    tiny = {"model_kwargs": models.spec("small_cnn").tiny, "num_steps": 2, "eval_every": 2,
            "xla_options": {"xla_backend_optimization_level": 0}}  # fmt: skip
    record = train_and_evaluate(TrainConfig(**tiny), tmp_path, quiet=True)
    config = json.loads((tmp_path / "config.json").read_text())
    assert _batches(config["eval_conv_plan"]) == {"n360"}

    # `layoutlab evaluate` of that run asked for eval batches of 64: planned at 60, its
    # metrics the same images' (accuracy a count; the loss equal to the bit here, and 1e-5
    # leaves room for float32 sums in other groupings, 100x below one image's share).
    run = open_run(tmp_path)
    at_64 = dataclasses.replace(run, config=dataclasses.replace(run.config, eval_batch_size=64))
    assert _batches(on_current_eval_plan(at_64, 4).config.eval_conv_plan) == {"n60"}
    got = evaluate_run(at_64)
    assert got["test_accuracy"] == record["test_accuracy"]
    np.testing.assert_allclose(got["test_loss"], record["test_loss"], rtol=1e-5)

    more = TrainConfig(**{**tiny, "num_steps": 4, "eval_batch_size": 64})
    train_and_evaluate(more, tmp_path, resume=True, quiet=True)
    config = json.loads((tmp_path / "config.json").read_text())
    assert _batches(config["eval_conv_plan"]) == {"n60"}
    assert _batches(config["conv_plan"]) == {"n32"}  # the training plan is the run's own
