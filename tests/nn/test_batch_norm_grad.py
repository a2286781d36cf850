"""BatchNorm's hand-written backward (``nn.norm.batch_norm_train``) against PyTorch's
autograd in float64, in both layouts, and against autodiff through the batch statistics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from layoutlab.compare import assert_close
from layoutlab.nn import norm
from layoutlab.nn.norm import batch_norm_train

# The two arrangements batch_norm_train picks between by size; these inputs are small, so
# each is called directly (the dispatcher alone would only reach the centred one).
FORMS = {"centred": norm.batch_norm_train_centred, "affine": norm.batch_norm_train_affine}

# Float32 forward and backward against a float64 reference: each gradient entry is a sum of
# at most n = 2*5*6 = 60 products of order-one terms, so its rounding error is a few float32
# ulps times sqrt(n) ~ 1e-6 of the largest entry; 2e-5 leaves room and still rejects a
# wrong formula (a missing term is off by order one).
RTOL, ATOL_SCALE = 2e-5, 2e-5
AXES = {"NHWC": (0, 1, 2), "NCHW": (0, 2, 3)}


def _inputs(layout, offset=1.0):
    rng = np.random.default_rng(0)
    shape = (2, 5, 6, 3) if layout == "NHWC" else (2, 3, 5, 6)
    x = rng.standard_normal(shape).astype(np.float32) * 3 + np.float32(offset)
    scale = rng.standard_normal(3).astype(np.float32)
    bias = rng.standard_normal(3).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    return x, scale, bias, dy


@pytest.mark.torch
@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize(
    "layout,jit,offset",
    [
        ("NHWC", False, 1.0),
        ("NCHW", False, 1.0),
        ("NHWC", True, 1.0),
        ("NCHW", True, 1.0),
        # Mean 100x the std: the forward's x * a + (bias - mean * a) and the input gradient's
        # b * x - b * mean cancel terms of size |mean| / std, so their rounding grows to
        # about that many float32 ulps of the result, 100 * 6e-8 = 6e-6, inside RTOL.
        ("NHWC", True, 300.0),
    ],
)
def test_gradients_match_torch_float64(form, layout, jit, offset):
    torch = pytest.importorskip("torch")
    x, scale, bias, dy = _inputs(layout, offset)

    def loss(x, s, b):
        y, _, _ = FORMS[form](x, s, b, AXES[layout], 1e-5)
        return jnp.sum(y * dy)

    # Jitted too: XLA fuses the backward differently from eager dispatch.
    grad = jax.grad(loss, argnums=(0, 1, 2))
    grads = (jax.jit(grad) if jit else grad)(x, scale, bias)

    to_cf = (lambda a: np.moveaxis(a, -1, 1)) if layout == "NHWC" else (lambda a: a)
    tx = torch.tensor(to_cf(x), dtype=torch.float64, requires_grad=True)
    ts = torch.tensor(scale, dtype=torch.float64, requires_grad=True)
    tb = torch.tensor(bias, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.batch_norm(tx, None, None, ts, tb, training=True, eps=1e-5)
    (y * torch.tensor(to_cf(dy), dtype=torch.float64)).sum().backward()
    expected = (
        np.moveaxis(tx.grad.numpy(), 1, -1) if layout == "NHWC" else tx.grad.numpy(),
        ts.grad.numpy(),
        tb.grad.numpy(),
    )
    for name, got, want in zip(("dx", "dscale", "dbias"), grads, expected, strict=True):
        atol = ATOL_SCALE * float(np.max(np.abs(want)))
        assert_close(np.asarray(got), want, rtol=RTOL, atol=atol, name=f"{name} {layout}")


@pytest.mark.parametrize("form", sorted(FORMS))
def test_statistics_outputs_carry_their_gradient(form):
    # BatchNorm only feeds mean/var to the running averages (no gradient), but the function
    # returns them, so a loss that uses them must get their gradient too. Reference:
    # autodiff of the same formula written plainly, in float32 (the same arithmetic, a
    # different derivation), so the bar is float32 rounding.
    x, scale, bias, dy = _inputs("NHWC")
    axes = AXES["NHWC"]

    def plain(x, s, b):
        mean = jnp.mean(x, axes, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axes, keepdims=True)
        y = (x - mean) * jax.lax.rsqrt(var + 1e-5) * s.reshape(1, 1, 1, -1) + b.reshape(1, 1, 1, -1)
        return y, mean.reshape(-1), var.reshape(-1)

    def loss(fn):
        def f(x, s, b):
            y, mean, var = fn(x, s, b, *(() if fn is plain else (axes, 1e-5)))
            return jnp.sum(y * dy) + jnp.sum(mean * bias) + jnp.sum(jnp.sqrt(var) * scale)

        return f

    got = jax.grad(loss(FORMS[form]), argnums=(0, 1, 2))(x, scale, bias)
    want = jax.grad(loss(plain), argnums=(0, 1, 2))(x, scale, bias)
    for g, w in zip(got, want, strict=True):
        w = np.asarray(w)
        assert_close(np.asarray(g), w, rtol=RTOL, atol=ATOL_SCALE * float(np.max(np.abs(w))))


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("jit", [False, True])
def test_a_loss_of_the_statistics_alone_gets_their_gradient(form, jit):
    # The output itself unused: its cotangent reaches the backward as a symbolic zero, the
    # statistics' as arrays. Same reference and bar as above.
    x, scale, bias, _ = _inputs("NHWC")
    axes = AXES["NHWC"]

    def stats_loss(x):
        _, mean, var = FORMS[form](x, scale, bias, axes, 1e-5)
        return jnp.sum(mean * bias) + jnp.sum(jnp.sqrt(var) * scale)

    def plain_loss(x):
        mean = jnp.mean(x, axes, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axes)
        return jnp.sum(mean.reshape(-1) * bias) + jnp.sum(jnp.sqrt(var) * scale)

    grad = jax.jit(jax.grad(stats_loss)) if jit else jax.grad(stats_loss)
    got, want = np.asarray(grad(x)), np.asarray(jax.grad(plain_loss)(x))
    assert np.max(np.abs(want)) > 0
    assert_close(got, want, rtol=RTOL, atol=ATOL_SCALE * float(np.max(np.abs(want))))


def test_the_form_follows_the_activation_size(monkeypatch):
    # Each form is replaced by a marker to see which one batch_norm_train calls.
    monkeypatch.setattr(norm, "batch_norm_train_centred", lambda *a: "centred")
    monkeypatch.setattr(norm, "batch_norm_train_affine", lambda *a: "affine")
    s = b = jnp.ones(8)
    small = jnp.ones((1, 4, 4, 8))
    large = jnp.ones((1, norm.AFFINE_MIN_ELEMENTS // 8, 1, 8))
    assert batch_norm_train(small, s, b, (0, 1, 2), 1e-5) == "centred"
    assert batch_norm_train(large, s, b, (0, 1, 2), 1e-5) == "affine"


def test_both_forms_agree_on_an_activation_above_the_threshold():
    # The dispatcher's large path, jitted, on a real size: both forms compute the same
    # arithmetic, rearranged, so they agree to float32 rounding of sums over n = 2048
    # values per channel (~sqrt(n) ulps ~ 3e-6 of the largest entry; 2e-5 as above).
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 16, 16, 64)).astype(np.float32) * 2 + 0.5
    assert x.size >= norm.AFFINE_MIN_ELEMENTS
    scale, bias = (
        rng.standard_normal(64).astype(np.float32),
        rng.standard_normal(64).astype(np.float32),
    )
    dy = rng.standard_normal(x.shape).astype(np.float32)

    def grads(fn):
        def loss(x, s, b):
            return jnp.sum(fn(x, s, b, (0, 1, 2), 1e-5)[0] * dy)

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(x, scale, bias)

    got, want = grads(batch_norm_train), grads(norm.batch_norm_train_centred)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        w = np.asarray(w)
        assert_close(np.asarray(g), w, rtol=RTOL, atol=ATOL_SCALE * float(np.max(np.abs(w))))
