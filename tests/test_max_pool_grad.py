"""MaxPool's hand-written backward (``nn.pooling.max_pool``) against PyTorch's autograd in
float64 and against XLA's own select-and-scatter, ties included."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from layoutlab.compare import assert_close
from layoutlab.nn.pooling import max_pool

# An input gradient entry is the sum of the output gradients of the (at most 4, for 3x3
# stride 2) windows whose maximum it is: float32 against float64 differs by a few ulps.
RTOL, ATOL = 1e-6, 1e-6


def _tied_input(shape, seed=0):
    """ReLU'd normals rounded to 0.5: many exact ties, as after a ReLU in a real network."""
    rng = np.random.default_rng(seed)
    return np.maximum(np.round(rng.standard_normal(shape) * 2) / 2, 0).astype(np.float32)


@pytest.mark.torch
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_gradient_matches_torch_float64_with_ties(layout):
    torch = pytest.importorskip("torch")
    x_cf = _tied_input((2, 3, 9, 10))
    g_cf = np.random.default_rng(1).standard_normal((2, 3, 5, 5)).astype(np.float32)
    tx = torch.tensor(x_cf, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.max_pool2d(tx, 3, 2, 1)
    (y * torch.tensor(g_cf, dtype=torch.float64)).sum().backward()
    want = tx.grad.numpy()
    if layout == "NHWC":
        x, g = np.moveaxis(x_cf, 1, -1), np.moveaxis(g_cf, 1, -1)
        dims, strides, pads = (1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 1), (0, 0))
        want = np.moveaxis(want, 1, -1)
    else:
        x, g = x_cf, g_cf
        dims, strides, pads = (1, 1, 3, 3), (1, 1, 2, 2), ((0, 0), (0, 0), (1, 1), (1, 1))
    y_torch = y.detach().numpy().astype(np.float32)
    y_ours, vjp = jax.vjp(lambda v: max_pool(v, dims, strides, pads), x)
    to_layout = (lambda a: np.moveaxis(a, 1, -1)) if layout == "NHWC" else (lambda a: a)
    np.testing.assert_array_equal(np.asarray(y_ours), to_layout(y_torch))
    (dx,) = vjp(jnp.asarray(g))
    assert_close(np.asarray(dx), want, rtol=RTOL, atol=ATOL, name=f"dx {layout}")


@pytest.mark.parametrize(
    ("shape", "dims", "strides", "pads"),
    [
        # 3D, non-overlapping windows, no padding.
        ((1, 4, 6, 6, 2), (1, 2, 2, 2, 1), (1, 2, 2, 2, 1), ((0, 0),) * 5),
        # 2D with string padding and a window wider than its stride in one dim only.
        ((2, 7, 8, 3), (1, 3, 2, 1), (1, 2, 2, 1), "SAME"),
        # Stride 1: every input position sits in up to 9 windows.
        ((1, 6, 6, 2), (1, 3, 3, 1), (1, 1, 1, 1), ((0, 0), (1, 1), (1, 1), (0, 0))),
    ],
)
def test_gradient_matches_xla_select_and_scatter(shape, dims, strides, pads):
    x = jnp.asarray(_tied_input(shape, seed=2))
    ref = lambda v: lax.reduce_window(v, -jnp.inf, lax.max, dims, strides, pads)
    y_ref, vjp_ref = jax.vjp(ref, x)
    y, vjp = jax.vjp(lambda v: max_pool(v, dims, strides, pads), x)
    g = jax.random.normal(jax.random.key(3), y.shape)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(y_ref))
    assert_close(np.asarray(vjp(g)[0]), np.asarray(vjp_ref(g)[0]), rtol=RTOL, atol=ATOL)
