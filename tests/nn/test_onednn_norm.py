"""oneDNN's batch normalization through XLA FFI (``nn.norm_onednn``) and ``BatchNorm``'s use of
it: forward and gradients against float64 NumPy over fuzzed shapes in float32 and bfloat16,
with and without the fused ReLU; the layer's bfloat16 training step on oneDNN, its running
averages as XLA's path makes them, the same bits twice; XLA's ops where the extension is
absent, where a run is data parallel and in an exported (custom-call-free) model; the ReLU of
``batch_norm_relu`` fused into oneDNN's call except where compare's tools watch the layers.

Reference: the closed-form batch norm and its gradient in float64 NumPy of the same inputs
(already rounded to the tested dtype), independent of oneDNN and of XLA. Tolerances, as a
fraction of the largest reference entry of each output:

- ``y`` and ``dx`` in bfloat16: each is computed in float32 and rounded once to bfloat16's 8
  significant bits, an error of at most 2^-8 of its own size; 2^-7 of the largest entry
  leaves room for the float32 part and still rejects a wrong formula (off by order one).
  Against XLA's path, which rounds its own float32 result once too, the same 2^-7 (each
  side within 2^-8 of the exact value).
- float32 ``y``/``dx`` and every float32 statistic or parameter gradient: sums over at most
  n = 192 elements per channel, a rounding error of n * 2^-24 ~ 1.1e-5 at worst; 2e-5.

The ReLU inputs are built away from the kink (a channel's values come in +-v pairs, so its
mean is 0, and every pre-activation is at least 0.01 from it): a decision within rounding of
zero may fall either way, which is not what this checks.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from onednn_helpers import simulate_no_onednn

from layoutlab.compare import assert_close
from layoutlab.compare.decisions import probe_decisions
from layoutlab.compare.layer_recording import record_layers
from layoutlab.nn import configure, norm, norm_onednn
from layoutlab.nn.configuration import without_custom_calls
from layoutlab.nn.conv_algos import onednn
from layoutlab.nn.norm import BatchNorm, batch_norm_relu
from layoutlab.precision import get_policy
from layoutlab.train.config import TrainConfig
from layoutlab.train.spec import resolve_spec
from layoutlab.xla.hlo import hlo_report

needs_onednn_norm = pytest.mark.skipif(
    norm_onednn.supports((2, 2, 2, 16), jnp.bfloat16, False, 1e-5) is not None,
    reason="oneDNN batch normalization unavailable",
)
EPS = 1e-5
TARGET = "layoutlab_onednn_batch_norm"
# (N, H, W, C): odd sizes, channels off oneDNN's blocks of 16.
SHAPES = [(2, 5, 6, 8), (3, 4, 4, 16), (4, 3, 7, 5), (2, 2, 3, 24)]
TOL = {"bfloat16": 2.0**-7, "float32": 2e-5}


def _inputs(shape, dtype, relu, seed):
    rng = np.random.default_rng(seed)
    c = shape[-1]
    if relu:  # per channel +-v pairs (and a 0 where the count is odd): mean 0, |v| >= 0.25
        m = int(np.prod(shape[:-1]))
        v = rng.uniform(0.25, 2.0, (m // 2, c))
        x = np.concatenate([v, -v, np.zeros((m % 2, c))])
        x = rng.permuted(x, axis=0).reshape(shape)
        bias = rng.uniform(0.01, 0.02, c) * rng.choice([-1.0, 1.0], c)
    else:
        x = rng.standard_normal(shape) * rng.uniform(0.5, 3, c) + rng.uniform(-2, 2, c)
        bias = rng.uniform(-1, 1, c)
    x = np.asarray(jnp.asarray(x, dtype).astype(jnp.float32))
    dy = np.asarray(jnp.asarray(rng.standard_normal(shape), dtype).astype(jnp.float32))
    scale = rng.uniform(0.5, 1.5, c).astype(np.float32)
    return x, scale, bias.astype(np.float32), dy


def _float64(x, scale, bias, dy, relu):
    x, scale, bias, dy = (np.asarray(a, np.float64) for a in (x, scale, bias, dy))
    n = x.size // x.shape[-1]
    mean = x.mean((0, 1, 2))
    var = ((x - mean) ** 2).mean((0, 1, 2))
    rstd = 1 / np.sqrt(var + np.float64(np.float32(EPS)))
    xhat = (x - mean) * rstd
    pre = xhat * scale + bias
    dz = dy * (pre > 0) if relu else dy
    db, ds = dz.sum((0, 1, 2)), (dz * xhat).sum((0, 1, 2))
    dx = scale * rstd / n * (n * dz - db - xhat * ds)
    y = np.maximum(pre, 0) if relu else pre
    return {"y": y, "mean": mean, "var": var, "dx": dx, "dscale": ds, "dbias": db}


def _check(out, ref, dtype, x_max):
    for key, expected in ref.items():
        tol = TOL[dtype] if key in ("y", "dx") else TOL["float32"]
        # The mean's terms are x's (a ReLU case's mean is 0 exactly).
        size = x_max if key == "mean" else np.abs(expected).max()
        actual = np.asarray(jnp.asarray(out[key]).astype(jnp.float32), np.float64)
        assert_close(actual, expected, rtol=0, atol=tol * size, name=key)


def _norm_step(relu):
    def step(x, scale, bias, dy):
        def f(x, scale, bias):
            y, mean, var = norm_onednn.batch_norm_train_nhwc(x, scale, bias, EPS, relu)
            return y, (mean, var)

        y, vjp, (mean, var) = jax.vjp(f, x, scale, bias, has_aux=True)
        dx, ds, db = vjp(dy)
        return {"y": y, "mean": mean, "var": var, "dx": dx, "dscale": ds, "dbias": db}

    return step


def _off_cpu_step(relu):
    """What ``batch_norm_train_nhwc`` runs off CPU (its XLA branch), as ``_norm_step``."""

    def step(x, scale, bias, dy):
        pre, mean, var = norm_onednn._xla_forward(x, scale, bias, EPS)
        y = (jnp.maximum(pre, 0.0) if relu else pre).astype(x.dtype)
        dx, ds, db = norm_onednn._xla_backward(x, dy, scale, bias, mean, var, EPS, relu)
        return {"y": y, "mean": mean, "var": var, "dx": dx, "dscale": ds, "dbias": db}

    return step


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_off_cpu_branch_matches_float64(dtype):
    cases = [(s, relu, k) for k, s in enumerate(SHAPES[:2]) for relu in (False, True)]
    args = [
        tuple(jnp.asarray(a, dtype if i in (0, 3) else jnp.float32) for i, a in enumerate(inp))
        for inp in (_inputs(s, dtype, relu, k) for s, relu, k in cases)
    ]
    run = jax.jit(lambda args: [_off_cpu_step(c[1])(*a) for c, a in zip(cases, args, strict=True)])
    for (shape, relu, k), out in zip(cases, run(args), strict=True):
        inputs = _inputs(shape, dtype, relu, k)
        _check(out, _float64(*inputs, relu), dtype, np.abs(inputs[0]).max())


@needs_onednn_norm
def test_a_program_lowered_for_gpu_holds_no_onednn_call():
    x = jax.ShapeDtypeStruct((2, 4, 4, 8), jnp.bfloat16)
    s = jax.ShapeDtypeStruct((8,), jnp.float32)

    def loss(x, scale, bias):
        y = norm_onednn.batch_norm_train_nhwc(x, scale, bias, EPS, True)[0]
        return jnp.sum(y.astype(jnp.float32))

    gpu = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(x, s, s)
    assert TARGET not in gpu.lower(lowering_platforms=("cuda",)).as_text()


@needs_onednn_norm
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_onednn_batch_norm_matches_float64(dtype):
    cases = [(s, relu, k) for k, s in enumerate(SHAPES) for relu in (False, True)]
    args = [
        tuple(jnp.asarray(a, dtype if i in (0, 3) else jnp.float32) for i, a in enumerate(inp))
        for inp in (_inputs(s, dtype, relu, k) for s, relu, k in cases)
    ]
    run = jax.jit(lambda args: [_norm_step(c[1])(*a) for c, a in zip(cases, args, strict=True)])
    for (shape, relu, k), out in zip(cases, run(args), strict=True):
        assert out["y"].dtype == out["dx"].dtype == jnp.dtype(dtype), (shape, relu)
        inputs = _inputs(shape, dtype, relu, k)
        _check(out, _float64(*inputs, relu), dtype, np.abs(inputs[0]).max())


def _layer(policy="mixed_bf16", impl="auto", channels=16):
    return BatchNorm(channels, policy=get_policy(policy), impl=impl)


def _train(layer, x):
    """``(y, dx, dscale, dbias, running mean, running var)`` of one training call, jitted, and
    the lowered program's text. The cotangent of ``y`` is fixed (it does not depend on how
    ``y`` was rounded)."""
    graph, state = nnx.split(layer)
    w = jnp.asarray(np.random.default_rng(1).standard_normal(x.shape), jnp.float32)

    def run(state, x):
        model = nnx.merge(graph, state)

        def f(model, x):
            y = model(x)
            return jnp.sum(y.astype(jnp.float32) * w), y

        (g, dx), y = nnx.grad(f, argnums=(0, 1), has_aux=True)(model, x)
        g, bn = (g, model) if isinstance(model, BatchNorm) else (g.bn, model.bn)
        return y, dx, g.scale[...], g.bias[...], bn.mean[...], bn.var[...]

    lowered = jax.jit(run).lower(state, x)
    return lowered.compile()(state, x), lowered.as_text()


def _x(dtype, shape=(4, 3, 5, 16), seed=0):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.standard_normal(shape) * 2 + 0.5, dtype)


@needs_onednn_norm
def test_bf16_layer_trains_on_onednn_like_xlas_path_and_repeats_its_bits():
    x = _x(jnp.bfloat16)
    out, text = _train(_layer(), x)
    assert TARGET in text and f"{TARGET}_grad" in text
    again, _ = _train(_layer(), x)
    assert all(np.array_equal(a, b) for a, b in zip(out, again, strict=True))
    xla, xla_text = _train(_layer(impl="xla"), x)
    assert TARGET not in xla_text
    # y and dx are bfloat16 (2^-7 of the largest entry, as above); the parameter gradients
    # and running averages float32 sums over n = 60 elements (2e-5).
    names = ("y", "dx", "dscale", "dbias", "running mean", "running var")
    for name, a, b in zip(names, out, xla, strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        tol = TOL["bfloat16"] if name in ("y", "dx") else TOL["float32"]
        assert_close(a, b, rtol=0, atol=tol * np.abs(b).max(), name=name)


@needs_onednn_norm
@pytest.mark.parametrize(
    "policy,dtype,why",
    [("fp32", jnp.float32, "float32 activations"), ("bf16", jnp.bfloat16, None)],
)
def test_onednn_runs_bfloat16_activations_only(policy, dtype, why):
    layer = _layer(policy)
    reason = layer.onednn_reason(_x(dtype))
    assert (reason is None) if why is None else (why in reason), reason


def test_falls_back_to_xlas_ops_where_the_extension_is_absent(monkeypatch):
    x = _x(jnp.bfloat16)
    simulate_no_onednn(monkeypatch)
    layer = _layer()
    assert "simulated: not built" in layer.onednn_reason(x)
    out, text = _train(layer, x)
    assert TARGET not in text
    xla, _ = _train(_layer(impl="xla"), x)
    assert all(np.array_equal(a, b) for a, b in zip(out, xla, strict=True))


def test_data_parallel_runs_and_exports_keep_xlas_batch_norm():
    assert resolve_spec(TrainConfig(data_parallel=True)).layer_impl == "xla"
    assert resolve_spec(TrainConfig(data_parallel=False)).layer_impl == "auto"
    model = nnx.Sequential(_layer(), _layer())
    for copy in (configure(model, batch_norm="xla"), without_custom_calls(model)):
        assert [m.impl for m in copy.layers] == ["xla", "xla"]
    assert [m.impl for m in model.layers] == ["auto", "auto"]
    # float32 activations never reach oneDNN: such a model is exported as it is.
    fp32 = nnx.Sequential(_layer("fp32"))
    assert without_custom_calls(fp32) is fp32
    with pytest.raises(ValueError, match="BatchNorm impl must be one of"):
        configure(model, batch_norm="onednn")


def test_inspect_counts_batch_norm_calls_apart_from_convs():
    x = jax.ShapeDtypeStruct((2, 4, 4, 8), jnp.float32)

    def step(x):
        y = jax.ffi.ffi_call(TARGET, x)(x)
        return jax.ffi.ffi_call(f"{TARGET}_grad", x)(y)

    report = hlo_report(jax.jit(step).lower(x).as_text(dialect="hlo"))
    assert report.onednn_convs() == {} and report.onednn_batch_norms() == 2
    assert "oneDNN batch norms: 2" in report.summary()


def test_impl_is_checked():
    with pytest.raises(ValueError, match="one of"):
        BatchNorm(4, impl="fast")
    assert norm.BATCH_NORM_IMPLS == ("auto", "xla")
    assert onednn.TARGET_PREFIX in TARGET


class _Block(nnx.Module):
    """A model's ``relu(bn(x))``, as the ResNet blocks write it."""

    def __init__(self, impl="auto"):
        self.bn = _layer(impl=impl)

    def __call__(self, x):
        return batch_norm_relu(self.bn, x)


def _relu_flags(text):
    """The ``relu`` attribute of each oneDNN batch-norm call in a lowered program."""
    return [line.split("relu = ")[1][0] for line in text.splitlines() if f"@{TARGET}" in line]


@needs_onednn_norm
def test_batch_norm_relu_fuses_the_relu_into_onednns_call_like_xlas_path():
    x = _x(jnp.bfloat16)
    out, text = _train(_Block(), x)
    assert _relu_flags(text) == ["1", "1"], _relu_flags(text)
    xla, _ = _train(_Block(impl="xla"), x)
    # As test_bf16_layer_trains_on_onednn_like_xlas_path_and_repeats_its_bits; a ReLU decision
    # within rounding of zero could differ (none does with these inputs).
    names = ("y", "dx", "dscale", "dbias", "running mean", "running var")
    for name, a, b in zip(names, out, xla, strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        tol = TOL["bfloat16"] if name in ("y", "dx") else TOL["float32"]
        assert_close(a, b, rtol=0, atol=tol * np.abs(b).max(), name=name)


@needs_onednn_norm
def test_watched_relus_and_batch_norms_stay_apart():
    x = _x(jnp.bfloat16)
    block = _Block()
    graph, state = nnx.split(block)
    with probe_decisions(block) as log:
        text = jax.jit(lambda s, x: nnx.merge(graph, s)(x)).lower(state, x).as_text()
    assert [d.kind for d in log.decisions] == ["relu"] and _relu_flags(text) == ["0"]
    _, layers = record_layers(block, x)
    (bn_out,) = [rec.value for rec in layers if rec.op == "BatchNorm"]
    assert float(jnp.min(bn_out)) < 0  # the BatchNorm's own output, before the ReLU
