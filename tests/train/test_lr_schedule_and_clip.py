"""The learning-rate schedules (warmup in epochs, min_lr, step decay) and gradient clipping
against hand computations, in float64 NumPy (train.lr_schedule, train.optim)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from layoutlab.train.config import TrainConfig
from layoutlab.train.optim import build_optimizer, make_schedule, optimizer_spec
from layoutlab.train.skip import skipped_steps


def _values(schedule, steps):
    # optax schedules rely on standard promotion (int step * float), as in the train step.
    with jax.numpy_dtype_promotion("standard"):
        return np.array([float(schedule(s)) for s in steps])


def test_step_schedule_warms_up_in_epochs_decays_at_epochs_and_keeps_the_floor():
    config = TrainConfig(
        learning_rate=0.1,
        schedule="step",
        warmup_epochs=0.5,
        lr_decay_epochs=[2, 4, 6],
        lr_decay_rate=0.1,
        min_lr=2e-4,
    )
    steps = np.arange(0, 80)
    got = _values(make_schedule(config, total_steps=80, steps_per_epoch=10.0), steps)
    # Reference: 5 warmup steps (0.5 epoch of 10) linear from min_lr to 0.1, then 0.1 times
    # 0.1 per milestone passed (steps 20, 40, 60), never below min_lr (0.1 * 1e-3 = 1e-4).
    decays = (steps >= 20).astype(int) + (steps >= 40) + (steps >= 60)
    after = np.maximum(0.1 * 0.1**decays, 2e-4)
    want = np.where(steps < 5, 2e-4 + (0.1 - 2e-4) * steps / 5, after)
    # float32 schedule arithmetic (a product of three 0.1s): a few ulps of 0.1.
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)


def test_cosine_ends_at_min_lr():
    config = TrainConfig(learning_rate=0.1, warmup_steps=10, min_lr=0.01)
    steps = np.arange(0, 111)
    got = _values(make_schedule(config, total_steps=110), steps)
    t = np.clip((steps - 10) / 100, 0, 1)
    want = np.where(steps < 10, 0.01 + 0.09 * steps / 10, 0.01 + 0.045 * (1 + np.cos(np.pi * t)))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)  # float32: a few ulps of 0.1
    assert got[-1] == pytest.approx(0.01, abs=1e-9)


def test_the_schedule_line_says_what_will_run():
    config = TrainConfig(learning_rate=0.003, min_lr=1e-5, warmup_epochs=1.0)
    spec = optimizer_spec(config, 1560, steps_per_epoch=78.0)
    line = "cosine 0.003 -> 1e-05 over 1560 steps, warmup 78 steps from 1e-05 (1 epoch)"
    assert spec.schedule_line == line
    assert line in spec.label
    step = dataclasses.replace(config, schedule="step", lr_decay_epochs=[10, 15])
    assert optimizer_spec(step, 1560, steps_per_epoch=78.0).schedule_line == (
        "step 0.003 x0.1 at steps 780,1170 (epochs 10,15) over 1560 steps, floor 1e-05, "
        "warmup 78 steps from 1e-05 (1 epoch)"
    )


def _sgd(**fields):
    config = TrainConfig(
        optimizer="sgd", learning_rate=0.5, schedule="constant", warmup_steps=0, weight_decay=0.0
    )
    return build_optimizer(optimizer_spec(dataclasses.replace(config, **fields), 10))


def test_clipping_acts_on_the_accumulated_gradient_and_a_bad_micro_step_is_skipped():
    params = {"w": jnp.zeros((3,), jnp.float32)}
    g1 = np.array([3.0, 0.0, 4.0], np.float32)  # norm 5
    g2 = np.array([0.0, 1.0, 0.0], np.float32)  # norm 1
    tx = _sgd(clip_grad_norm=0.01, accum_steps=2)
    state = tx.init(params)
    with jax.numpy_dtype_promotion("standard"):
        first, state = tx.update({"w": jnp.asarray(g1)}, state, params)
        # A non-finite micro-step between the two: skipped, the accumulator untouched.
        _, state = tx.update({"w": jnp.asarray([np.inf, 0.0, 0.0], np.float32)}, state, params)
        update, state = tx.update({"w": jnp.asarray(g2)}, state, params)
    assert int(skipped_steps(state)) == 1
    np.testing.assert_array_equal(first["w"], np.zeros(3))  # mid-accumulation: no update
    # Reference (float64): the mean gradient, scaled to norm 0.01, times -lr. Clipping each
    # micro-batch first would give (0.01 * g1 / 5 + 0.01 * g2) / 2, another direction.
    mean = (g1.astype(np.float64) + g2) / 2
    want = -0.5 * mean * 0.01 / np.linalg.norm(mean)
    # float32 norm and scaling of 3 values: a few ulps of 5e-3.
    np.testing.assert_allclose(update["w"], want, rtol=1e-6, atol=0)
    assert np.linalg.norm(np.asarray(update["w"], np.float64)) == pytest.approx(0.5 * 0.01, 1e-6)


def test_a_gradient_within_the_norm_is_not_clipped():
    params = {"w": jnp.zeros((2,), jnp.float32)}
    tx = _sgd(clip_grad_norm=10.0)
    with jax.numpy_dtype_promotion("standard"):
        update, _ = tx.update({"w": jnp.asarray([3.0, 4.0])}, tx.init(params), params)
    np.testing.assert_array_equal(update["w"], np.float32([-1.5, -2.0]))
