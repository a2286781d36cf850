"""Mixed precision through the real train step: it learns like fp32, fp16 needs loss scaling,
and a non-finite step (also inside gradient accumulation) changes nothing.

One small CNN on a fixed 320-example subset of digits, trained by ``make_train_step`` under
``jax.jit``; each (policy, optimizer) pair is compiled once and shared by the tests below,
without LLVM optimizations (``FAST_COMPILE``).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from layoutlab import models
from layoutlab.data import epoch_batches, get_dataset
from layoutlab.loss_scale import DynamicLossScale, NoOpLossScale, StaticLossScale
from layoutlab.train.skip import skip_nonfinite, skipped_steps
from layoutlab.train.state import create_train_state
from layoutlab.train.steps import cross_entropy, make_train_step

N_EXAMPLES, BATCH, EPOCHS, LR = 320, 32, 10, 3e-3
MODEL_KW = {"width": 8, "hidden": 32, "dropout": 0.0}  # no dropout: no RNG in the comparison
POLICIES = ("fp32", "mixed_bf16", "mixed_fp16")

# Final loss (mean training loss over the last epoch) may differ from fp32's by at most this.
# Measured |difference| over model seeds 0-7 with this data and schedule: <= 0.005 for
# mixed_bf16 and <= 0.0075 for mixed_fp16, with fp32 final losses of 0.03-0.10 (from ln 10 =
# 2.30), alike with and without LLVM optimizations. Half-precision rounding perturbs every
# step a little (bf16 ~2^-8, fp16 ~2^-11 relative) and the runs drift apart slowly; 0.02 is
# ~3x the worst measured spread and under 1% of the initial loss, so a policy that learns
# visibly worse fails.
FINAL_LOSS_TOL = 0.02
# The programs here are compiled as the training loop compiles init (LLVM unoptimized,
# train.program.INIT_COMPILER_OPTIONS), in about half the time. What is checked is decided in
# the HLO, which every level runs the same passes on: which ops run in float16 or bfloat16,
# the loss scaling, the skip; the level changes float32 results by rounding alone.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def _loss_scale(policy: str, initial: float = 2.0**15):
    # fp16 gets torch's GradScaler rule; the period never elapses in these short runs, and
    # every fp16 state uses the same hyperparameters so they share one compiled step.
    if policy == "mixed_fp16":
        return DynamicLossScale(initial, period=2000)
    return NoOpLossScale()


def _model(policy: str, seed: int = 0):
    return models.create("small_cnn", policy=policy, rngs=nnx.Rngs(seed), **MODEL_KW)


@functools.cache
def _trainer(policy: str, accum_steps: int = 1):
    """``(defs, tx, jitted step)``; one compile per (policy, accumulation)."""
    inner = optax.adam(LR)
    if accum_steps > 1:
        inner = optax.MultiSteps(inner, every_k_schedule=accum_steps)
    tx = skip_nonfinite(inner)
    defs, _ = create_train_state(_model(policy), tx, _loss_scale(policy))
    return defs, tx, jax.jit(make_train_step(defs, tx), compiler_options=FAST_COMPILE)


def _fresh_state(policy: str, *, accum_steps: int = 1, model=None, loss_scale=None):
    defs, tx, step = _trainer(policy, accum_steps)
    model = model if model is not None else _model(policy)
    loss_scale = loss_scale if loss_scale is not None else _loss_scale(policy)
    new_defs, state = create_train_state(model, tx, loss_scale)
    assert new_defs == defs  # same structure, so the cached step applies
    return state, step


@pytest.fixture(scope="module")
def batches():
    """EPOCHS epochs of a fixed 320-example subset, each epoch in its own seeded order."""
    ds = get_dataset("digits")
    subset = dataclasses.replace(
        ds, train_images=ds.train_images[:N_EXAMPLES], train_labels=ds.train_labels[:N_EXAMPLES]
    )
    return [
        (jnp.asarray(x), jnp.asarray(y))
        for epoch in range(EPOCHS)
        for x, y in epoch_batches(subset, "train", BATCH, seed=0, epoch=epoch)
    ]


def _train(state, step, batches):
    losses = []
    for x, y in batches:
        state, metrics = step(state, x, y)
        losses.append(metrics["loss"])
    return state, np.asarray(jax.device_get(losses))


@pytest.fixture(scope="module")
def runs(batches):
    out = {}
    for policy in POLICIES:
        state, step = _fresh_state(policy)
        out[policy] = _train(state, step, batches)
    return out


def _final(losses):
    return float(losses[-N_EXAMPLES // BATCH :].mean())


def test_policies_reach_fp32_final_loss(runs):
    reference = _final(runs["fp32"][1])
    for policy, (_, losses) in runs.items():
        final = _final(losses)
        print(f"{policy}: initial {losses[0]:.4f} final {final:.4f}")
        # All runs learned: from ~ln 10 to a small fraction of it.
        assert losses[0] > 2.0 and final < 0.1 * losses[0], policy
        assert abs(final - reference) <= FINAL_LOSS_TOL, (policy, final, reference)
    fp16_state = runs["mixed_fp16"][0]
    # A scale of 2^15 leaves headroom for these activations: no step was thrown away.
    assert int(skipped_steps(fp16_state.opt_state)) == 0


# ---------------------------------------------------------------- fp16 gradient underflow

# A classifier head initialised at a tiny scale (small- or zero-init heads are a common
# choice) makes every upstream activation gradient tiny: d features = d logits @ W_head^T.
# With |d logits| ~ 1/batch ~ 3e-2 and |W_head| ~ 1e-6 these are ~1e-8, below half of
# float16's smallest subnormal (2^-24 ~ 6e-8), so in fp16 they round to exactly zero and so
# does every gradient behind them. In fp32 they are small but fine. This is the situation
# loss scaling exists for (Micikevicius et al., 2018): multiply the loss by 2^16 and the
# same cotangents sit comfortably inside fp16's range.
HEAD_SCALE = 1e-5


def _tiny_head_model(policy: str):
    model = _model(policy)
    head = model.classifier[-1]
    head.kernel[...] = head.kernel[...] * jnp.float32(HEAD_SCALE)
    return model


def _grad_fn(policy: str, images, labels):
    """Jitted ``(params, rest, loss_scale) -> unscaled f32 grads`` of the tiny-head model."""
    graphdef, params, rest = nnx.split(_tiny_head_model(policy), nnx.Param, ...)

    @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
    def grads(params, rest, loss_scale):
        def loss(p):
            logits = nnx.merge(graphdef, p, rest, copy=True)(images)
            return loss_scale.scale(cross_entropy(logits, labels))

        return loss_scale.unscale(jax.grad(loss)(params))

    return functools.partial(grads, params, rest)


def _host(leaf) -> np.ndarray:
    if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):  # the models' RNG streams
        leaf = jax.random.key_data(leaf)
    return np.asarray(leaf)


def _leaves(tree) -> dict[str, np.ndarray]:
    return {
        jax.tree_util.keystr(path): _host(leaf)
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
    }


def test_fp16_gradients_underflow_without_loss_scaling(batches):
    images, labels = batches[0]
    g32 = _leaves(_grad_fn("fp32", images, labels)(StaticLossScale(1.0)))
    fp16 = _grad_fn("mixed_fp16", images, labels)
    unscaled = _leaves(fp16(StaticLossScale(1.0)))
    scaled = _leaves(fp16(StaticLossScale(2.0**16)))
    features = [k for k in g32 if "features" in k]
    assert features
    for k in features:
        # Without scaling every conv/BN gradient is exactly zero in fp16, not in fp32.
        assert np.count_nonzero(g32[k]) == g32[k].size, k
        assert not np.any(unscaled[k]), k
        # With 2^16 no entry that is non-zero in fp32 is zero, and the gradient is fp32's
        # up to fp16 rounding of the activations: measured relative error <= 0.06 (BN
        # bias/scale gradients are sums with cancellation); 0.15 leaves 2.5x margin while
        # an underflowed gradient has relative error 1.
        assert np.all(scaled[k] != 0), k
        rel = np.linalg.norm(scaled[k] - g32[k]) / np.linalg.norm(g32[k])
        assert rel < 0.15, (k, rel)
    # The head's own gradient (hidden^T @ d logits) is not small and does not underflow.
    head = [k for k in g32 if "['classifier']['layers'][3]" in k]
    assert len(head) == 2
    for k in head:
        assert np.array_equal(unscaled[k] == 0, g32[k] == 0), k


def test_fp16_tiny_head_trains_with_dynamic_scaling(batches):
    features = lambda s: s.params["features"]
    # Unscaled (a "dynamic" scale pinned at 1 shares the compiled step): the first update
    # leaves every conv and BN parameter bit-identical, its gradients having underflowed.
    state, step = _fresh_state(
        "mixed_fp16",
        model=_tiny_head_model("mixed_fp16"),
        loss_scale=_loss_scale("mixed_fp16", 1.0),
    )
    after, _ = step(state, *batches[0])
    assert _tree_bits_equal(features(after), features(state))

    state, step = _fresh_state("mixed_fp16", model=_tiny_head_model("mixed_fp16"))
    after, _ = step(state, *batches[0])
    for k, (old, new) in _paired(features(state), features(after)):
        assert not np.array_equal(old, new), f"{k} did not train"
    trained, losses = _train(state, step, batches)
    assert losses[0] > 2.0 and _final(losses) < 0.1 * losses[0]
    assert np.all(np.isfinite(losses))


# ---------------------------------------------------------------- fault injection


def _bits(x) -> np.ndarray:
    """Floats as their bit patterns, so NaNs compare equal and -0.0 differs from 0.0."""
    x = np.asarray(x)
    return x.view(f"u{x.dtype.itemsize}") if jnp.issubdtype(x.dtype, jnp.inexact) else x


def _paired(a, b):
    la, lb = _leaves(a), _leaves(b)
    assert la.keys() == lb.keys()
    return [(k, (la[k], lb[k])) for k in la]


def _tree_bits_equal(a, b) -> bool:
    return all(np.array_equal(_bits(x), _bits(y)) for _, (x, y) in _paired(a, b))


def _poison(images):
    return images.at[0, 0, 0, 0].set(jnp.inf)


def test_nonfinite_step_changes_nothing_and_training_continues(batches):
    state, step = _fresh_state("mixed_fp16")
    for x, y in batches[:3]:
        state, _ = step(state, x, y)
    scale = float(state.loss_scale.loss_scale)
    before_skipped = int(skipped_steps(state.opt_state))

    bad, metrics = step(state, _poison(batches[3][0]), batches[3][1])
    assert not bool(metrics["grads_finite"])
    assert _tree_bits_equal(bad.params, state.params)
    # The batch stats of the bad batch are discarded.
    assert _tree_bits_equal(bad.model_state, state.model_state)
    assert _tree_bits_equal(bad.opt_state.inner_state, state.opt_state.inner_state)
    assert int(skipped_steps(bad.opt_state)) == before_skipped + 1
    assert float(bad.loss_scale.loss_scale) == scale / 2  # GradScaler's backoff
    assert int(bad.loss_scale.counter) == 0

    good, metrics = step(bad, *batches[4])
    assert bool(metrics["grads_finite"]) and np.isfinite(float(metrics["loss"]))
    assert not _tree_bits_equal(good.params, bad.params)
    assert int(skipped_steps(good.opt_state)) == before_skipped + 1
    assert all(np.all(np.isfinite(v)) for v in jax.tree.leaves(good.params))


def test_skipped_micro_step_does_not_poison_the_accumulator(batches):
    # skip_nonfinite(MultiSteps(adam, 2)): micro-steps g1, bad, g2 must equal g1, g2.
    state, step = _fresh_state("mixed_fp16", accum_steps=2)
    (x1, y1), (x2, y2) = batches[0], batches[1]
    s1, _ = step(state, x1, y1)
    multi = lambda s: s.opt_state.inner_state
    assert int(multi(s1).mini_step) == 1
    assert _tree_bits_equal(s1.params, state.params)  # accumulating, no update yet

    s2, metrics = step(s1, _poison(x2), y2)
    assert not bool(metrics["grads_finite"])
    assert _tree_bits_equal(s2.params, s1.params)
    assert _tree_bits_equal(s2.model_state, s1.model_state)
    assert _tree_bits_equal(multi(s2), multi(s1))  # accumulator and mini-step untouched
    assert int(skipped_steps(s2.opt_state)) == 1

    s3, _ = step(s2, x2, y2)
    # The clean run sees g2 with the loss scale the faulty run had backed off to, so every
    # input of that step is the same and the results must match bit for bit.
    clean, _ = step(s1._replace(loss_scale=s2.loss_scale), x2, y2)
    assert int(multi(s3).mini_step) == 0 and int(multi(s3).gradient_step) == 1
    assert not _tree_bits_equal(s3.params, s1.params)  # the accumulated update was applied
    assert _tree_bits_equal(s3.params, clean.params)
    assert _tree_bits_equal(s3.model_state, clean.model_state)
    assert _tree_bits_equal(multi(s3), multi(clean))
    acc = multi(s3).acc_grads
    assert all(np.all(np.isfinite(a)) for a in jax.tree.leaves(acc))
