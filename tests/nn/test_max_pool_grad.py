"""MaxPool's hand-written backward (``nn.pooling.max_pool``) against PyTorch's autograd in
float64 and against XLA's own select-and-scatter, ties and NaN windows included."""

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


def _check_against_torch(x_cf, g_cf, layout, k=3, s=2, p=1):
    """Forward and input gradient of ``max_pool`` against torch ``max_pool2d`` in float64,
    for NCHW arrays ``x_cf`` and ``g_cf`` run in ``layout``."""
    torch = pytest.importorskip("torch")
    tx = torch.tensor(x_cf, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.max_pool2d(tx, k, s, p)
    (y * torch.tensor(g_cf, dtype=torch.float64)).sum().backward()
    want = tx.grad.numpy()
    if layout == "NHWC":
        x, g = np.moveaxis(x_cf, 1, -1), np.moveaxis(g_cf, 1, -1)
        dims, strides, pads = (1, k, k, 1), (1, s, s, 1), ((0, 0), (p, p), (p, p), (0, 0))
        want = np.moveaxis(want, 1, -1)
    else:
        x, g = x_cf, g_cf
        dims, strides, pads = (1, 1, k, k), (1, 1, s, s), ((0, 0), (0, 0), (p, p), (p, p))
    y_torch = y.detach().numpy().astype(np.float32)
    y_ours, vjp = jax.vjp(lambda v: max_pool(v, dims, strides, pads), x)
    to_layout = (lambda a: np.moveaxis(a, 1, -1)) if layout == "NHWC" else (lambda a: a)
    np.testing.assert_array_equal(np.asarray(y_ours), to_layout(y_torch))  # NaNs in place
    (dx,) = vjp(jnp.asarray(g))
    assert_close(np.asarray(dx), want, rtol=RTOL, atol=ATOL, name=f"dx {layout}")
    return np.asarray(dx)


@pytest.mark.torch
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_gradient_matches_torch_float64_with_ties(layout):
    x_cf = _tied_input((2, 3, 9, 10))
    g_cf = np.random.default_rng(1).standard_normal((2, 3, 5, 5)).astype(np.float32)
    _check_against_torch(x_cf, g_cf, layout)


@pytest.mark.torch
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_nan_window_gradient_goes_to_its_nan_as_in_torch(layout):
    """A window holding a NaN outputs NaN and its gradient goes to its last NaN (torch's
    ``val > maxval || isnan(val)``), not nowhere: ties elsewhere, overlapping 3x3 stride-2
    windows, single and double NaNs per window, a NaN before and after a larger value."""
    x_cf = _tied_input((2, 3, 9, 10), seed=4)
    x_cf[0, 0, 0, 1] = np.nan  # one NaN, in two windows
    x_cf[0, 1, 4, 4] = np.nan  # two NaNs in one window: the later one (row-major) takes it
    x_cf[0, 1, 5, 5] = np.nan
    x_cf[1, 2, 8, 9] = np.nan  # in the corner, beside the padding
    x_cf[1, 0, 3, 4] = 9.0  # a NaN after the largest value, in both its windows
    x_cf[1, 0, 3, 5] = np.nan
    g_cf = np.random.default_rng(5).standard_normal((2, 3, 5, 5)).astype(np.float32)
    dx = _check_against_torch(x_cf, g_cf, layout)
    dx_cf = np.moveaxis(dx, -1, 1) if layout == "NHWC" else dx
    nan_windows = np.isnan(
        np.asarray(max_pool(x_cf, (1, 1, 3, 3), (1, 1, 2, 2), ((0, 0), (0, 0), (1, 1), (1, 1))))
    )
    # Every NaN window's gradient lands on one of the input's NaNs.
    assert nan_windows.sum() >= 6
    np.testing.assert_allclose(dx_cf[np.isnan(x_cf)].sum(), g_cf[nan_windows].sum(), rtol=1e-6)
    assert dx_cf[0, 1, 4, 4] == 0.0 and dx_cf[0, 1, 5, 5] != 0.0
    assert dx_cf[1, 0, 3, 4] == 0.0 and dx_cf[1, 0, 3, 5] != 0.0


def test_nan_routing_differs_from_xla_select_and_scatter():
    """XLA:CPU's autodiff gradient of a NaN window goes to the element after the NaN (its
    ``ge`` selection flips on every comparison with NaN), ours to the NaN: recorded here
    because ``max_pool``'s docstring says so."""
    x = jnp.asarray([1.0, np.nan, 2.0], jnp.float32).reshape(1, 1, 3, 1)
    args = ((1, 1, 3, 1), (1, 1, 3, 1), ((0, 0),) * 4)
    _, ours = jax.vjp(lambda v: max_pool(v, *args), x)
    _, xla = jax.vjp(lambda v: lax.reduce_window(v, -jnp.inf, lax.max, *args), x)
    g = jnp.ones((1, 1, 1, 1), jnp.float32)
    np.testing.assert_array_equal(np.asarray(ours(g)[0]).ravel(), [0.0, 1.0, 0.0])
    np.testing.assert_array_equal(np.asarray(xla(g)[0]).ravel(), [0.0, 0.0, 1.0])


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
