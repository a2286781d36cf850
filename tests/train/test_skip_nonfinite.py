"""Fault injection: inf/NaN gradients are skipped, bit for bit, with and without accumulation."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from layoutlab.loss_scale import DynamicLossScale, StaticLossScale, all_finite
from layoutlab.train.skip import (
    BRANCHES,
    SkipNonFiniteState,
    apply_if_finite_updates,
    last_step_finite,
    skip_nonfinite,
    skipped_steps,
    update_and_apply,
)


def _assert_bits_equal(a, b):
    """Every leaf equal in value *and* bit pattern (assert_array_equal alone calls -0.0 == 0.0)."""
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(leaves_a, leaves_b, strict=True):
        x, y = np.atleast_1d(np.asarray(x)), np.atleast_1d(np.asarray(y))
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(
            x.view(np.uint8).reshape(-1), y.view(np.uint8).reshape(-1), err_msg="bit pattern"
        )


# --- a tiny linear regression ----------------------------------------------------------------

_RNG = np.random.default_rng(0)
_X = _RNG.normal(size=(16, 4)).astype(np.float32)
_W_TRUE = np.asarray([0.5, -0.25, 0.75, 0.1], np.float32)
_Y = _X @ _W_TRUE + np.float32(0.25)


def _loss(params):
    return jnp.mean(jnp.square(_X @ params["w"] + params["b"] - _Y))


def _init_params():
    return {"w": jnp.zeros([4], jnp.float32), "b": jnp.zeros([], jnp.float32)}


_OPTIMIZERS = {
    "sgd_momentum": lambda: optax.sgd(0.1, momentum=0.5),
    "adamw": lambda: optax.adamw(0.05, b1=0.5, weight_decay=1e-4),
}

_BAD_STEPS = (3, 4, 30)  # two in a row, then one later
_GOOD_STEPS = 80


def _make_step(tx):
    @jax.jit
    def step(params, opt_state, loss_scale, poison):
        grads = jax.grad(lambda p: loss_scale.scale(_loss(p)))(params)
        grads = loss_scale.unscale(grads)
        grads = {**grads, "w": grads["w"].at[0].add(poison)}  # the injected fault
        # optax's adam bias correction raises a Python float to an int32 power, which strict
        # promotion rejects; only the optimizer call is traced under standard promotion.
        with jax.numpy_dtype_promotion("standard"):
            updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, loss_scale.adjust(all_finite(grads))

    return step


def _run(step, tx, poisons):
    params = _init_params()
    history = [(params, tx.init(params), DynamicLossScale(period=5))]
    for poison in poisons:
        history.append(step(*history[-1], jnp.asarray(poison, jnp.float32)))
    return history


# Both ways of branching (``train.skip``): the CPU default "cond" and "select".
@pytest.fixture(
    scope="module",
    params=[(name, branch) for name in sorted(_OPTIMIZERS) for branch in BRANCHES],
    ids=lambda p: "-".join(p),
)
def optimizer(request):
    name, branch = request.param
    tx = skip_nonfinite(_OPTIMIZERS[name](), branch=branch)
    return tx, _make_step(tx)


@pytest.mark.parametrize("name", sorted(_OPTIMIZERS))
def test_both_branches_agree(name):
    """The "cond" branch runs the update only on finite gradients, "select" discards it:
    the same steps are skipped and counted, and the params and optimizer state agree to
    float32 rounding. Not bit for bit: XLA fuses the update differently inside a
    conditional, and a multiply-add can round its last bit differently (seen: 1 ulp)."""
    poisons = [np.nan if i in _BAD_STEPS else 0.0 for i in range(12)]
    runs = []
    for branch in BRANCHES:
        tx = skip_nonfinite(_OPTIMIZERS[name](), branch=branch)
        runs.append(_run(_make_step(tx), tx, poisons))
    for a, b in zip(*runs, strict=True):
        assert int(skipped_steps(a[1])) == int(skipped_steps(b[1]))
        assert bool(last_step_finite(a[1])) == bool(last_step_finite(b[1]))
        # 1e-6 relative, 1e-7 absolute: a few float32 ulps of O(0.1-1) values after 12 steps.
        for x, y in zip(jax.tree.leaves(a[:2]), jax.tree.leaves(b[:2]), strict=True):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)
    params, updates = _init_params(), {"w": jnp.ones([4]), "b": jnp.asarray(np.inf)}
    for finite in (True, False):
        got = [apply_if_finite_updates(params, updates, jnp.asarray(finite), b) for b in BRANCHES]
        _assert_bits_equal(got[0], got[1])
    with pytest.raises(ValueError, match="branch must be one of"):
        skip_nonfinite(optax.sgd(0.1), branch="if")


def _make_fused_step(tx, branch):
    """``_make_step`` with the optimizer and params updates through ``update_and_apply``
    (what ``make_train_step`` runs), the gradients checked once."""

    @jax.jit
    def step(params, opt_state, loss_scale, poison):
        grads = jax.grad(lambda p: loss_scale.scale(_loss(p)))(params)
        grads = loss_scale.unscale(grads)
        grads = {**grads, "w": grads["w"].at[0].add(poison)}
        finite = all_finite(grads)
        with jax.numpy_dtype_promotion("standard"):
            params, opt_state = update_and_apply(tx, grads, opt_state, params, finite, branch)
        return params, opt_state, loss_scale.adjust(finite)

    return step


@pytest.mark.parametrize("branch", BRANCHES)
@pytest.mark.parametrize("name", sorted(_OPTIMIZERS))
def test_update_and_apply_skips_like_update_then_apply(name, branch):
    """One conditional around the optimizer and params updates (``update_and_apply``) against
    ``tx.update`` then ``apply_updates`` (the path checked bit for bit above): the same steps
    skipped and counted, a skipped step bit-identical, the rest equal to float32 rounding
    (1e-6 relative, 1e-7 absolute, as in ``test_both_branches_agree``: XLA may fuse the
    update differently inside the conditional)."""
    poisons = [np.nan if i in _BAD_STEPS else 0.0 for i in range(12)]
    tx = skip_nonfinite(_OPTIMIZERS[name](), branch=branch)
    fused = _run(_make_fused_step(tx, branch), tx, poisons)
    plain = _run(_make_step(tx), tx, poisons)
    for i, (a, b) in enumerate(zip(fused, plain, strict=True)):
        assert int(skipped_steps(a[1])) == int(skipped_steps(b[1]))
        assert bool(last_step_finite(a[1])) == bool(last_step_finite(b[1]))
        for x, y in zip(jax.tree.leaves(a[:2]), jax.tree.leaves(b[:2]), strict=True):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)
        if i in _BAD_STEPS:
            _assert_bits_equal(fused[i + 1][0], a[0])
            _assert_bits_equal(fused[i + 1][1].inner_state, a[1].inner_state)
    assert int(skipped_steps(fused[-1][1])) == sum(p != 0.0 for p in poisons) == 2


def test_a_verdict_passed_in_replaces_the_check():
    """``grads_finite`` decides in place of ``all_finite(updates)``: a Python bool (a branch
    of the caller's own conditional) or a traced one."""
    params = {"w": jnp.asarray([1.0, -0.0], jnp.float32)}
    grads = {"w": jnp.asarray([0.5, 0.5], jnp.float32)}
    for branch in BRANCHES:
        tx = skip_nonfinite(optax.sgd(0.1, momentum=0.9), branch=branch)
        state = tx.init(params)
        for verdict in (False, jnp.asarray(False)):
            updates, new = tx.update(grads, state, params, grads_finite=verdict)
            assert np.all(np.signbit(np.asarray(updates["w"]))) and int(skipped_steps(new)) == 1
            _assert_bits_equal(new.inner_state, state.inner_state)
        updates, new = tx.update(grads, state, params, grads_finite=True)
        np.testing.assert_array_equal(updates["w"], np.asarray([-0.05, -0.05], np.float32))
        assert int(skipped_steps(new)) == 0 and bool(last_step_finite(new))
    with pytest.raises(ValueError, match="branch must be one of"):
        update_and_apply(tx, grads, tx.init(params), params, jnp.asarray(True), "if")
    # A transformation without the skip wrapper is updated and applied the plain way.
    plain = optax.sgd(0.1)
    new_params, _ = update_and_apply(
        plain, grads, plain.init(params), params, jnp.asarray(False), "cond"
    )
    _assert_bits_equal(new_params, params)


def test_cpu_steps_branch_with_cond():
    from layoutlab.fast_defaults import default_skip_branch

    assert (default_skip_branch("cpu"), default_skip_branch("gpu")) == ("cond", "select")


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_bad_steps_are_skipped_bit_for_bit(optimizer, bad):
    tx, step = optimizer
    n = _GOOD_STEPS + len(_BAD_STEPS)
    history = _run(step, tx, [bad if i in _BAD_STEPS else 0.0 for i in range(n)])
    for i in range(n):
        (p0, s0, ls0), (p1, s1, ls1) = history[i], history[i + 1]
        if i in _BAD_STEPS:
            _assert_bits_equal(p1, p0)
            _assert_bits_equal(s1.inner_state, s0.inner_state)
            assert int(skipped_steps(s1)) == int(skipped_steps(s0)) + 1
            assert not bool(last_step_finite(s1))
            # GradScaler's backoff: half the scale, growth counter back to zero.
            assert float(ls1.loss_scale) == float(ls0.loss_scale) / 2
            assert int(ls1.counter) == 0
        else:
            assert int(skipped_steps(s1)) == int(skipped_steps(s0))
            assert bool(last_step_finite(s1))
            assert not np.array_equal(np.asarray(p1["w"]), np.asarray(p0["w"]))
    assert int(skipped_steps(history[-1][1])) == len(_BAD_STEPS)


def test_skipping_equals_never_seeing_the_bad_steps_and_converges(optimizer):
    tx, step = optimizer
    n = _GOOD_STEPS + len(_BAD_STEPS)
    faulty_run = _run(step, tx, [np.inf if i in _BAD_STEPS else 0.0 for i in range(n)])
    clean_run = _run(step, tx, [0.0] * _GOOD_STEPS)
    faulty, clean = faulty_run[-1], clean_run[-1]
    # The good steps ran under different loss scales (the faulty run backed off three
    # times), but power-of-two scaling and unscaling are exact in float32, so the gradients
    # and hence the whole trajectory are bit-identical.
    faulty_scales = [float(h[2].loss_scale) for i, h in enumerate(faulty_run[:-1])]
    faulty_scales = [s for i, s in enumerate(faulty_scales) if i not in _BAD_STEPS]
    assert faulty_scales != [float(h[2].loss_scale) for h in clean_run[:-1]]
    _assert_bits_equal(faulty[0], clean[0])
    _assert_bits_equal(faulty[1].inner_state, clean[1].inner_state)
    # Converges to the float64 least-squares solution. 1e-3: after 80 steps the optimization
    # error is ~1e-4 for both optimizers (adamw's 1e-4 weight decay biases it by less).
    design = np.concatenate([_X, np.ones([16, 1], np.float32)], axis=1).astype(np.float64)
    solution, *_ = np.linalg.lstsq(design, _Y.astype(np.float64), rcond=None)
    got = np.concatenate([np.asarray(faulty[0]["w"]), np.asarray(faulty[0]["b"])[None]])
    np.testing.assert_allclose(got, solution, atol=1e-3, rtol=0)


# --- -0.0, explicit selection, state lookup ---------------------------------------------------


def test_negative_zero_params_survive_a_skipped_step():
    params = {"w": jnp.asarray([-0.0, 1.0, -0.0, 2.0], jnp.float32)}
    tx = skip_nonfinite(optax.sgd(0.1, momentum=0.9))
    state = tx.init(params)
    nan_grads = {"w": jnp.asarray([1.0, np.nan, 1.0, 1.0], jnp.float32)}
    updates, state = jax.jit(tx.update)(nan_grads, state, params)
    # Skipped updates are -0.0, and x + (-0.0) == x bit for bit (x + 0.0 would flip -0.0).
    assert np.all(np.signbit(np.asarray(updates["w"])))
    _assert_bits_equal(optax.apply_updates(params, updates), params)


def test_apply_if_finite_updates_selects_old_params():
    params = {"w": jnp.asarray([-0.0, 1.0], jnp.float32), "n": None}
    updates = {"w": jnp.asarray([np.nan, 0.5], jnp.float32), "n": None}
    kept = jax.jit(apply_if_finite_updates)(params, updates, jnp.asarray(False))
    _assert_bits_equal(kept, params)
    good = {"w": jnp.asarray([0.25, 0.5], jnp.float32), "n": None}
    applied = apply_if_finite_updates(params, good, jnp.asarray(True))
    np.testing.assert_array_equal(applied["w"], np.asarray([0.25, 1.5], np.float32))


def test_skipped_steps_finds_the_counter_in_nested_states():
    params = {"w": jnp.ones([2], jnp.float32)}
    tx = optax.chain(optax.clip_by_global_norm(1.0), skip_nonfinite(optax.sgd(0.1)))
    state = tx.init(params)
    _, state = tx.update({"w": jnp.asarray([np.inf, 0.0], jnp.float32)}, state, params)
    assert int(skipped_steps({"opt": [state]})) == 1
    with pytest.raises(ValueError, match="found 0"):
        skipped_steps(optax.sgd(0.1).init(params))
    with pytest.raises(ValueError, match="found 2"):
        skipped_steps((state, state))


def test_rejects_non_transformations():
    with pytest.raises(TypeError, match="GradientTransformation"):
        skip_nonfinite(lambda g: g)


def test_nnx_optimizer_skips_and_reports():
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, skip_nonfinite(optax.sgd(0.1, momentum=0.9)), wrt=nnx.Param)

    @nnx.jit
    def train_step(model, optimizer, poison):
        def loss_fn(model):
            return jnp.mean(jnp.square(model(jnp.ones([4, 3], jnp.float32))))

        grads = nnx.grad(loss_fn)(model)
        grads = jax.tree.map(lambda g: g + poison, grads)
        optimizer.update(model, grads)

    before = jax.tree.map(np.asarray, nnx.state(model, nnx.Param))
    train_step(model, optimizer, jnp.asarray(np.nan, jnp.float32))
    _assert_bits_equal(jax.tree.map(np.asarray, nnx.state(model, nnx.Param)), before)
    assert int(skipped_steps(optimizer.opt_state)) == 1
    train_step(model, optimizer, jnp.asarray(0.0, jnp.float32))
    assert int(skipped_steps(optimizer.opt_state)) == 1
    after = nnx.state(model, nnx.Param)
    assert not np.array_equal(np.asarray(after["kernel"][...]), before["kernel"])


# --- gradient accumulation --------------------------------------------------------------------


def _micro_grads(n):
    rng = np.random.default_rng(1)
    return [{"w": jnp.asarray(rng.normal(size=[3]), jnp.float32)} for _ in range(n)]


def _accumulate(tx, grads_seq):
    params = {"w": jnp.asarray([1.0, -2.0, 0.5], jnp.float32)}

    @jax.jit
    def update(grads, state, params):
        # MultiSteps divides float accumulators by an int32 counter: see _make_step.
        with jax.numpy_dtype_promotion("standard"):
            return tx.update(grads, state, params)

    states = [tx.init(params)]
    for grads in grads_seq:
        updates, state = update(grads, states[-1], params)
        params = optax.apply_updates(params, updates)
        states.append(state)
    return params, states


@pytest.mark.parametrize("branch", BRANCHES)
def test_multisteps_inside_skip_ignores_the_bad_micro_step(branch):
    k, lr = 3, 0.1
    tx = skip_nonfinite(optax.MultiSteps(optax.sgd(lr), every_k_schedule=k), branch=branch)
    g = _micro_grads(6)
    bad = {"w": g[0]["w"].at[1].set(np.inf)}
    faulty_params, faulty = _accumulate(tx, [g[0], g[1], bad, g[2], g[3], bad, g[4], g[5]])
    clean_params, clean = _accumulate(tx, g)
    # After g0, g1, bad: the accumulator and micro-step counter are as after g0, g1.
    _assert_bits_equal(faulty[3].inner_state, clean[2].inner_state)
    assert int(faulty[3].inner_state.mini_step) == 2
    _assert_bits_equal(faulty_params, clean_params)
    _assert_bits_equal(faulty[-1].inner_state, clean[-1].inner_state)
    assert int(skipped_steps(faulty[-1])) == 2
    # Independent check of the first emitted step: plain SGD on the mean of g0, g1, g2.
    # 1e-6: a float32 running mean of three O(1) numbers, then one float32 step.
    first_window, _ = _accumulate(tx, g[:3])
    expected = np.asarray([1.0, -2.0, 0.5]) - lr * np.mean(
        [np.asarray(x["w"], np.float64) for x in g[:3]], axis=0
    )
    np.testing.assert_allclose(np.asarray(first_window["w"]), expected, rtol=0, atol=1e-6)


def test_skip_inside_multisteps_poisons_the_accumulator():
    # Why the wrapping order matters: inside MultiSteps the inf lands in the accumulator,
    # MultiSteps resets it by multiplying by zero, and 0 * inf is NaN forever after.
    tx = optax.MultiSteps(skip_nonfinite(optax.sgd(0.1)), every_k_schedule=2)
    g = _micro_grads(5)
    bad = {"w": g[0]["w"].at[0].set(np.inf)}
    params, states = _accumulate(tx, [g[0], bad, g[1], g[2], g[3], g[4]])
    assert not bool(all_finite(states[-1].acc_grads))
    assert int(skipped_steps(states[-1])) == 3  # every window since the bad micro-step
    np.testing.assert_array_equal(np.asarray(params["w"]), np.asarray([1.0, -2.0, 0.5]))
    assert isinstance(states[-1].inner_opt_state, SkipNonFiniteState)


# --- float16 underflow ------------------------------------------------------------------------


def test_fp16_gradients_underflow_without_a_loss_scale():
    rng = np.random.default_rng(2)
    n = 4
    x = jnp.asarray(rng.normal(size=[n, 4]), jnp.float16)
    w = jnp.asarray(rng.normal(size=[4]), jnp.float16)
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    residual = rng.uniform(0.25, 1.5, size=[n]) * rng.choice([-1.0, 1.0], size=[n])
    y = jnp.asarray(x64 @ w64 - residual, jnp.float32)
    weight = 2.0**-26  # a small loss: d(loss)/d(pred) = 2**-27 * residual, below fp16's 2**-24

    def loss(w, x):
        pred = (x @ w).astype(jnp.float32)  # model in w's dtype, loss in float32 (FP32_OPS)
        return jnp.float32(weight) * jnp.mean(jnp.square(pred - y))

    plain = jax.jit(jax.grad(loss))(w, x)
    ls = StaticLossScale(2.0**16)
    scaled = jax.jit(lambda w, x: ls.unscale(jax.grad(lambda w: ls.scale(loss(w, x)))(w)))(w, x)
    f32 = jax.jit(jax.grad(loss))(w.astype(jnp.float32), x.astype(jnp.float32))
    reference = weight * 2.0 / n * x64.T @ (x64 @ w64 - np.asarray(y, np.float64))
    # float32 against float64: a few float32 roundings on O(1) values, relative to |grad|.
    np.testing.assert_allclose(np.asarray(f32), reference, rtol=1e-4, atol=0)

    assert plain.dtype == jnp.float16 and np.all(np.asarray(plain) == 0)
    assert np.all(reference != 0)
    assert scaled.dtype == jnp.float32 and np.all(np.asarray(scaled) != 0)
    # 5e-3 of the largest component: float16 rounds the forward pred, the cotangents and the
    # 4-term dot, about ten roundings of 2**-11 (4.9e-4) each; measured ~6e-4. A lost or
    # doubled scale factor would be off by 100% or more.
    atol = 5e-3 * np.max(np.abs(reference))
    for expected in (np.asarray(f32), reference):
        np.testing.assert_allclose(np.asarray(scaled), expected, rtol=5e-3, atol=atol)
