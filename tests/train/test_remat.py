"""Gradient checkpointing (``remat=True``) composed with fp16, dynamic loss scaling and skips.

ResNet-18 (tiny, CIFAR stem) with every residual block wrapped in ``nnx.remat``: the train
step must give the same losses and params as without remat, a skipped step included, and
the compiled program must actually recompute the blocks' forward convs in the backward.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from compare_helpers import fast_model
from flax import nnx

from layoutlab import nn
from layoutlab.loss_scale import DynamicLossScale
from layoutlab.train.skip import skip_nonfinite, skipped_steps
from layoutlab.train.state import create_train_state
from layoutlab.train.steps import make_train_step
from layoutlab.xla.hlo import hlo_report

pytestmark = pytest.mark.slow  # two ResNet-18 train-step compiles

BATCH, SIZE, STEPS, BAD_STEP = 4, 8, 4, 1
# Both steps are compiled without LLVM optimizations (as the training loop compiles init,
# train.program.INIT_COMPILER_OPTIONS), which halves a ResNet-18 step's compile on CPU. What
# is checked here is decided before LLVM: remat's recomputation and barriers are HLO, and
# every level runs the same HLO passes (CSE included) on both programs.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def _model(remat: bool):
    # NumPy-drawn weights, the same for both (eager init compiles each small op per shape).
    return fast_model(
        "resnet18", num_classes=10, policy="mixed_fp16", width=8, stem="cifar", remat=remat
    )


def _batches():
    rng = np.random.default_rng(0)
    out = []
    for i in range(STEPS):
        x = jnp.asarray(rng.standard_normal((BATCH, SIZE, SIZE, 3)), jnp.float32)
        y = jnp.asarray(rng.integers(0, 10, BATCH), jnp.int32)
        if i == BAD_STEP:  # an inf in the input: every gradient of this step is non-finite
            x = x.at[0, 0, 0, 0].set(jnp.inf)
        out.append((x, y))
    return out


def _block_convs(model) -> int:
    """Convs inside the residual blocks, the part that ``remat=True`` wraps."""
    stages = (model.layer1, model.layer2, model.layer3, model.layer4)
    return sum(isinstance(node, nn.Conv) for stage in stages for _, node in nnx.iter_graph(stage))


def _setup(remat: bool, batches):
    model = _model(remat)
    block_convs = _block_convs(model)
    tx = skip_nonfinite(optax.sgd(0.05, momentum=0.9))
    defs, state = create_train_state(model, tx, DynamicLossScale(2.0**12, period=2000))
    step = make_train_step(defs, tx)
    lowered = jax.jit(step).lower(state, *batches[0])
    return (
        step,
        state,
        {
            "initial": state.params,
            "pre_hlo": lowered.as_text(dialect="hlo"),
            "lowered": lowered,  # compiled alone only by the GPU test, for its optimized HLO
            "block_convs": block_convs,
        },
    )


@pytest.fixture(scope="module")
def runs():
    batches = _batches()
    (step_p, state_p, plain), (step_r, state_r, remat) = (_setup(r, batches) for r in (False, True))
    # Each program's HLO is lowered on its own above; both steps then run as one program,
    # compiled once (a third less compile than two): each has its own state, so neither's
    # ops fuse with or fold into the other's.
    both = jax.jit(lambda p, r, x, y: (step_p(p, x, y), step_r(r, x, y)))
    compiled = both.lower(state_p, state_r, *batches[0]).compile(FAST_COMPILE)
    for r in (plain, remat):
        r["losses"], r["finite"] = [], []
    for x, y in batches:
        (state_p, m_p), (state_r, m_r) = compiled(state_p, state_r, x, y)
        for r, metrics in ((plain, m_p), (remat, m_r)):
            r["losses"].append(float(metrics["loss"]))
            r["finite"].append(bool(metrics["grads_finite"]))
    plain["state"], remat["state"] = state_p, state_r
    for r in (plain, remat):
        r["losses"] = np.asarray(r["losses"])
    return {False: plain, True: remat}


def test_remat_matches_plain_training(runs):
    plain, remat = runs[False], runs[True]
    expected_finite = [i != BAD_STEP for i in range(STEPS)]
    for r in (plain, remat):
        assert r["finite"] == expected_finite
        assert int(skipped_steps(r["state"].opt_state)) == 1
        assert float(r["state"].loss_scale.loss_scale) == 2.0**11  # one backoff, no growth
    # Recomputation re-runs the same fp16 ops on the same inputs. A backend may still fuse the
    # recomputed forward differently or pick another conv algorithm for it, which changes an
    # activation by an fp16 rounding (2^-11 relative) that then spreads through the backward:
    # losses agree to 1e-3 relative (2 fp16 ulps) and params to 1% of the update they
    # received. XLA:CPU compiles both to the same program, so there they agree exactly.
    good = np.asarray(expected_finite)
    np.testing.assert_allclose(remat["losses"][good], plain["losses"][good], rtol=1e-3)
    assert np.isnan(plain["losses"][BAD_STEP]) and np.isnan(remat["losses"][BAD_STEP])
    leaves = lambda tree: [np.asarray(x, np.float64) for x in jax.tree.leaves(tree)]
    for p_plain, p0, p_remat in zip(
        leaves(plain["state"].params),
        leaves(plain["initial"]),
        leaves(remat["state"].params),
        strict=True,
    ):
        moved = np.abs(p_plain - p0).max()
        assert moved > 0
        assert np.abs(p_remat - p_plain).max() <= 0.01 * moved


def test_remat_recomputes_block_convs(runs):
    plain, remat = runs[False], runs[True]
    before = hlo_report(plain["pre_hlo"])
    after = hlo_report(remat["pre_hlo"])
    # Each wrapped block's forward runs once more in the backward, so every conv inside a
    # block appears one extra time; JAX puts an optimization barrier on each block's inputs
    # so that XLA's common-subexpression elimination does not merge the two copies.
    assert remat["block_convs"] == plain["block_convs"] > 0
    extra = len(after.convolutions) - len(before.convolutions)
    assert extra == remat["block_convs"]
    assert before.op_counts.get("opt-barrier", 0) == 0
    assert after.op_counts.get("opt-barrier", 0) > 0


@pytest.mark.gpu
def test_optimized_hlo_keeps_the_recomputation(runs):
    # The optimized program should run the extra convs too (on GPU as cuDNN custom-calls).
    # XLA:CPU's optimized program drops the barriers and comes out identical to the plain
    # one (same op counts and temp memory, jax 0.10), so this check needs a GPU.
    plain = hlo_report(runs[False]["lowered"].compile(FAST_COMPILE).as_text())
    remat = hlo_report(runs[True]["lowered"].compile(FAST_COMPILE).as_text())
    assert len(remat.convolutions) > len(plain.convolutions)
