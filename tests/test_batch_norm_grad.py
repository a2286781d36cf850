"""BatchNorm's hand-written backward (``nn.norm.batch_norm_train``) against PyTorch's
autograd in float64, in both layouts, and against autodiff through the batch statistics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from layoutlab.compare import assert_close
from layoutlab.nn.norm import batch_norm_train

# Float32 forward and backward against a float64 reference: each gradient entry is a sum of
# at most n = 2*5*6 = 60 products of order-one terms, so its rounding error is a few float32
# ulps times sqrt(n) ~ 1e-6 of the largest entry; 2e-5 leaves room and still rejects a
# wrong formula (a missing term is off by order one).
RTOL, ATOL_SCALE = 2e-5, 2e-5
AXES = {"NHWC": (0, 1, 2), "NCHW": (0, 2, 3)}


def _inputs(layout):
    rng = np.random.default_rng(0)
    shape = (2, 5, 6, 3) if layout == "NHWC" else (2, 3, 5, 6)
    x = rng.standard_normal(shape).astype(np.float32) * 3 + 1
    scale = rng.standard_normal(3).astype(np.float32)
    bias = rng.standard_normal(3).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    return x, scale, bias, dy


@pytest.mark.torch
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_gradients_match_torch_float64(layout):
    torch = pytest.importorskip("torch")
    x, scale, bias, dy = _inputs(layout)

    def loss(x, s, b):
        y, _, _ = batch_norm_train(x, s, b, AXES[layout], 1e-5)
        return jnp.sum(y * dy)

    grads = jax.grad(loss, argnums=(0, 1, 2))(x, scale, bias)

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


def test_statistics_outputs_carry_their_gradient():
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

    got = jax.grad(loss(batch_norm_train), argnums=(0, 1, 2))(x, scale, bias)
    want = jax.grad(loss(plain), argnums=(0, 1, 2))(x, scale, bias)
    for g, w in zip(got, want, strict=True):
        w = np.asarray(w)
        assert_close(np.asarray(g), w, rtol=RTOL, atol=ATOL_SCALE * float(np.max(np.abs(w))))
