"""``max_pool`` on oneDNN's primitives (``nn.pool_onednn``, ``native/onednn_pool.cc``): outputs
and gradients against a float64 NumPy reference with ``max_pool``'s routing (first maximum in
row-major window order, a NaN window's last NaN), NaN and infinity windows, determinism, the
fallback where the extension is absent, and ``configure``/export switching it off."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from onednn_helpers import simulate_no_onednn

from layoutlab.nn import configure, pool_onednn
from layoutlab.nn.configuration import without_custom_calls
from layoutlab.nn.pooling import MaxPool, max_pool, onednn_pool_reason
from layoutlab.train.config import TrainConfig
from layoutlab.train.spec import resolve_spec
from layoutlab.xla.hlo import hlo_report
from layoutlab.xla.hlo_extract import ONEDNN_PREFIX

STEM = ((1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 1), (0, 0)))
needs_onednn_pool = pytest.mark.skipif(
    pool_onednn.supports((2, 9, 9, 8), jnp.float32, *STEM) is not None,
    reason="oneDNN max pooling unavailable",
)

# (NHWC shape, window, strides, padding, dtype): ResNet's stem, stride 1, a window wider than
# its stride in one axis only, asymmetric and "SAME" padding, channels not a multiple of 16.
CASES = [
    ((2, 9, 10, 8), (3, 3), (2, 2), ((1, 1), (1, 1)), "float32"),
    ((2, 9, 10, 8), (3, 3), (2, 2), ((1, 1), (1, 1)), "bfloat16"),
    ((1, 6, 7, 20), (3, 3), (1, 1), ((1, 1), (1, 1)), "bfloat16"),
    ((2, 7, 8, 3), (3, 2), (2, 2), ((1, 1), (0, 0)), "float32"),
    ((1, 8, 9, 17), (3, 3), (2, 1), ((0, 2), (1, 0)), "float32"),
    ((2, 11, 6, 5), (3, 3), (2, 2), "SAME", "bfloat16"),
]


def _args(case):
    shape, (kh, kw), (sh, sw), pads = case[:4]
    full = pads if isinstance(pads, str) else ((0, 0), *pads, (0, 0))
    return shape, (1, kh, kw, 1), (1, sh, sw, 1), full


def _tied(shape, seed):
    """ReLU'd normals rounded to 0.5: many exact ties, as after a ReLU."""
    rng = np.random.default_rng(seed)
    return np.maximum(np.round(rng.standard_normal(shape) * 2) / 2, 0).astype(np.float32)


def _reference(x, g, dims, strides, pads):
    """float64 ``(y, dx)`` by loops: padding is -inf; the gradient goes to the first maximum
    in row-major window order, or to the window's last NaN."""
    if isinstance(pads, str):
        pads = jax.lax.padtype_to_pads(x.shape, dims, strides, pads)
    (_, kh, kw, _), (_, sh, sw, _) = dims, strides
    xp = np.pad(x.astype(np.float64), pads, constant_values=-np.inf)
    n, hp, wp, c = xp.shape
    oh, ow = (hp - kh) // sh + 1, (wp - kw) // sw + 1
    y = np.empty((n, oh, ow, c))
    dxp, absp = np.zeros_like(xp), np.zeros_like(xp)
    for b, i, j, ch in itertools.product(range(n), range(oh), range(ow), range(c)):
        win = xp[b, i * sh : i * sh + kh, j * sw : j * sw + kw, ch].ravel()
        nans = np.flatnonzero(np.isnan(win))
        k = nans[-1] if nans.size else int(np.argmax(win))  # argmax: the first maximum
        y[b, i, j, ch] = np.nan if nans.size else win[k]
        dxp[b, i * sh + k // kw, j * sw + k % kw, ch] += g[b, i, j, ch]
        absp[b, i * sh + k // kw, j * sw + k % kw, ch] += abs(g[b, i, j, ch])
    (t, _), (left, _) = pads[1], pads[2]
    crop = (slice(None), slice(t, t + x.shape[1]), slice(left, left + x.shape[2]))
    return y, dxp[crop], absp[crop]


def _assert_gradient(dx, dx_ref, abs_ref, dtype, dims, strides):
    """Each input gradient entry sums the output gradients (each exact in the dtype) of the
    at most ``fan`` windows it is the maximum of. float32: a few ulps. bfloat16: the sum may
    be formed in bfloat16, each of its ``fan`` roundings off by at most 2**-9 of the sum of
    the magnitudes."""
    if dtype == "float32":
        np.testing.assert_allclose(dx, dx_ref, rtol=1e-6, atol=1e-6)
        return
    fan = -(-dims[1] // strides[1]) * -(-dims[2] // strides[2])
    assert np.all(np.abs(dx - dx_ref) <= fan * 2.0**-9 * abs_ref), np.abs(dx - dx_ref).max()


def _run(x, dims, strides, pads, g, impl="auto"):
    y, vjp = jax.vjp(lambda v: max_pool(v, dims, strides, pads, impl), x)
    return np.asarray(y, np.float32), np.asarray(vjp(g)[0], np.float32)


@needs_onednn_pool
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}-{c[4]}")
def test_forward_and_gradient_match_float64_reference(case):
    shape, dims, strides, pads = _args(case)
    dtype = case[4]
    assert onednn_pool_reason(jax.ShapeDtypeStruct(shape, dtype), dims, strides, pads) is None
    x = jnp.asarray(_tied(shape, seed=sum(shape)), dtype)
    y_shape = jax.eval_shape(lambda v: max_pool(v, dims, strides, pads, "xla"), x).shape
    g = jax.random.normal(jax.random.key(1), y_shape).astype(dtype)
    y, dx = _run(x, dims, strides, pads, g)
    x64, g64 = (np.asarray(a, np.float64) for a in (x, g))
    y_ref, dx_ref, abs_ref = _reference(x64, g64, dims, strides, pads)
    np.testing.assert_array_equal(y, y_ref)  # a maximum is one of the inputs: exact
    # A gradient routed to another tied element would be off by a whole output gradient.
    _assert_gradient(dx, dx_ref, abs_ref, dtype, dims, strides)


@needs_onednn_pool
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_nan_and_infinite_windows_route_as_max_pool_promises(dtype):
    """oneDNN's own max skips NaN and starts from the lowest finite value: an input holding a
    NaN or an infinity is pooled by the handler's loop with ``max_pool``'s rules instead."""
    shape, dims, strides, pads = _args(CASES[0])
    x = _tied(shape, seed=4)
    x[0, 0, 1, 0] = np.nan  # one NaN, in two windows
    x[0, 4, 4, 1] = x[0, 5, 5, 1] = np.nan  # two in one window: the later one takes it
    x[1, 3, 4, 0], x[1, 3, 5, 0] = 9.0, np.nan  # a NaN after the largest value
    x[1, :3, :3, 2] = -np.inf  # a window of -inf only: -inf out, gradient to its first
    x[0, 6, 6, 3] = np.inf
    x = jnp.asarray(x, dtype)
    g = jax.random.normal(jax.random.key(5), (2, 5, 5, 8)).astype(dtype)
    y, dx = _run(x, dims, strides, pads, g)
    x64, g64 = (np.asarray(a, np.float64) for a in (x, g))
    y_ref, dx_ref, abs_ref = _reference(x64, g64, dims, strides, pads)
    np.testing.assert_array_equal(y, y_ref)
    _assert_gradient(dx, dx_ref, abs_ref, dtype, dims, strides)
    assert dx[0, 4, 4, 1] == 0 and dx[0, 5, 5, 1] != 0 and dx[1, 3, 4, 0] == 0
    y_xla, dx_xla = _run(x, dims, strides, pads, g, "xla")
    np.testing.assert_array_equal(y, y_xla)
    np.testing.assert_array_equal(dx != 0, dx_xla != 0)


@needs_onednn_pool
def test_same_bits_twice_and_custom_calls_in_the_program():
    x = jnp.asarray(_tied((4, 16, 16, 32), seed=7), jnp.bfloat16)
    g = jax.random.normal(jax.random.key(2), (4, 8, 8, 32)).astype(jnp.bfloat16)
    step = jax.jit(lambda x, g: jax.vjp(lambda v: max_pool(v, *STEM), x)[1](g)[0])
    first, second = np.asarray(step(x, g)), np.asarray(step(x, g))
    assert first.tobytes() == second.tobytes()
    text = step.lower(x, g).as_text()
    assert f"{ONEDNN_PREFIX}max_pool" in text and f"{ONEDNN_PREFIX}max_pool_grad" in text
    # inspect counts them apart from the convs and batch norms
    report = hlo_report(step.lower(x, g).as_text(dialect="hlo"))
    assert report.onednn_max_pools() == 2 and report.totals()["onednn_max_pools"] == 2
    assert report.onednn_convs() == {} and report.onednn_batch_norms() == 0
    assert "oneDNN max pools: 2" in report.summary()


def test_xla_where_oneDNN_is_absent_or_does_not_pay(monkeypatch):
    x = jax.ShapeDtypeStruct((2, 8, 8, 16), jnp.float32)
    # Windows no larger than their stride (VGG's 2x2/2), NCHW windows, 3D, float16: XLA's ops.
    assert "do not overlap" in onednn_pool_reason(x, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    assert onednn_pool_reason(x, (1, 1, 3, 3), (1, 1, 2, 2), "SAME") is not None
    assert onednn_pool_reason(x, *STEM, impl="xla") == "impl='xla'"
    half = jax.ShapeDtypeStruct((2, 8, 8, 16), jnp.float16)
    assert "float16" in onednn_pool_reason(half, *STEM)
    simulate_no_onednn(monkeypatch)
    assert "unavailable" in onednn_pool_reason(x, *STEM)
    xv = jnp.asarray(_tied(x.shape, seed=3))
    fn = jax.jit(jax.grad(lambda v: max_pool(v, *STEM).sum()))
    assert ONEDNN_PREFIX not in fn.lower(xv).as_text()
    ref = jax.grad(lambda v: max_pool(v, *STEM, "xla").sum())(xv)
    np.testing.assert_array_equal(np.asarray(fn(xv)), np.asarray(ref))


def test_configure_and_export_switch_max_pools_to_xla():
    # A data-parallel run's program configures its max pools to "xla" (a oneDNN call on a
    # batch split over devices would gather it).
    assert resolve_spec(TrainConfig(data_parallel=True)).layer_impl == "xla"
    assert resolve_spec(TrainConfig(data_parallel=False)).layer_impl == "auto"
    model = nnx.Sequential(MaxPool(3, 2, 1), MaxPool(2, 2))
    assert model.layers[0].may_call_onednn() and not model.layers[1].may_call_onednn()
    for copy in (configure(model, max_pool="xla"), without_custom_calls(model)):
        assert [m.impl for m in copy.layers] == ["xla", "xla"]
    assert [m.impl for m in model.layers] == ["auto", "auto"]
    only_vgg = nnx.Sequential(MaxPool(2, 2))
    assert without_custom_calls(only_vgg) is only_vgg
    with pytest.raises(ValueError, match="max_pool impl must be one of"):
        configure(model, max_pool="onednn")


@needs_onednn_pool
def test_a_program_lowered_for_gpu_holds_no_onednn_call():
    """Off CPU the custom VJP's other branch runs: XLA's reduce-window and max_pool's own
    backward, whose outputs ``impl="xla"`` checks above."""
    x = jax.ShapeDtypeStruct((2, 8, 8, 16), jnp.bfloat16)
    loss = lambda v: jnp.sum(max_pool(v, *STEM).astype(jnp.float32))
    traced = jax.jit(jax.grad(loss)).trace(x)
    assert ONEDNN_PREFIX in traced.lower().as_text()
    assert ONEDNN_PREFIX not in traced.lower(lowering_platforms=("cuda",)).as_text()
