"""Per-layer precision rules, read off the jaxpr: what each layer computes in, and FP32_OPS.

Convs and dots run in the compute dtype with float32 accumulation when it is half (a conv
on the CPU with a float32 result, elsewhere with a half one: ``test_half_conv_lowering.py``); the
layers that claim an ``fp32_op`` keep their statistics in float32 unless the policy turns
``fp32_ops`` off (apex O3). Everything here traces (``make_jaxpr``/``eval_shape``) or runs
tiny eager ops, so nothing is compiled beyond a handful of small kernels.
"""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from layoutlab import models, nn
from layoutlab.precision import FP32_OPS, PRESETS, get_policy
from layoutlab.train.steps import cross_entropy

F32, F16, BF16 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(jnp.bfloat16)
HALF = (F16, BF16)

# Primitives that reduce many values into one (the statistics of the FP32_OPS).
STAT_PRIMITIVES = {"reduce_sum", "reduce_window_sum", "dot_general"}


def _sub_jaxprs(params):
    for value in params.values():
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if hasattr(item, "eqns"):  # Jaxpr
                yield item
            elif hasattr(getattr(item, "jaxpr", None), "eqns"):  # ClosedJaxpr
                yield item.jaxpr


def _eqns(jaxpr):
    """Every equation, descending into sub-jaxprs (pjit, custom_jvp, ...)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in _sub_jaxprs(eqn.params):
            yield from _eqns(sub)


def _dtypes(vars_) -> list[np.dtype]:
    return [np.dtype(v.aval.dtype) for v in vars_ if hasattr(v.aval, "dtype")]


def _layer_jaxpr(layer, x):
    graphdef, state = nnx.split(layer)

    def apply(state, x):
        return nnx.merge(graphdef, state)(x)

    return jax.make_jaxpr(apply)(state, x).jaxpr


# ---------------------------------------------------------------- convs and dots


def _conv_and_dense(policy):
    rngs = nnx.Rngs(0)
    conv = nn.Conv(3, 4, 3, policy=policy, rngs=rngs)
    dense = nn.Dense(5, 6, policy=policy, rngs=rngs)
    return [
        (conv, jnp.ones((2, 6, 6, 3)), "conv_general_dilated"),
        (dense, jnp.ones((2, 5)), "dot_general"),
    ]


@pytest.mark.parametrize("name, half", [("mixed_bf16", BF16), ("mixed_fp16", F16)])
def test_conv_dense_compute_half_accumulate_f32(name, half):
    policy = get_policy(name)
    for layer, x, prim in _conv_and_dense(policy):
        jaxpr = _layer_jaxpr(layer, x)
        ops = [e for e in _eqns(jaxpr) if e.primitive.name == prim]
        assert all(_dtypes(op.invars) == [half, half] for op in ops), prim
        wide = [op for op in ops if _dtypes(op.outvars) == [F32]]
        assert len(wide) == 1, prim
        assert np.dtype(wide[0].params["preferred_element_type"]) == F32, prim
        if prim == "conv_general_dilated":
            # A conv is written per backend (nn.conv_algos.native.xla_conv): the CPU's
            # branch above, every other backend's half in and half out, widened after.
            narrow = [op for op in ops if op not in wide]
            assert len(narrow) == 1 and _dtypes(narrow[0].outvars) == [half], narrow
        else:
            assert len(ops) == 1, prim
        # The layer hands on activations in the compute dtype.
        assert jaxpr.outvars[0].aval.dtype == half
        assert layer.kernel[...].dtype == F32  # params stay in param_dtype


def test_conv_dense_fp32_has_no_half():
    for layer, x, prim in _conv_and_dense(get_policy("fp32")):
        jaxpr = _layer_jaxpr(layer, x)
        seen = {d for e in _eqns(jaxpr) for d in _dtypes(e.invars) + _dtypes(e.outvars)}
        assert not seen & set(HALF), prim
        assert jaxpr.outvars[0].aval.dtype == F32


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_params_and_outputs_follow_policy(name):
    """Params in param_dtype, BN running stats in f32, model output in output_dtype."""
    policy = PRESETS[name]
    model = nnx.eval_shape(
        lambda: models.create("small_cnn", policy=policy, width=4, hidden=16, dropout=0.0)
    )
    params = jax.tree.leaves(nnx.state(model, nnx.Param))
    assert params and {np.dtype(p.dtype) for p in params} == {policy.param_dtype}
    stats = jax.tree.leaves(nnx.state(model, nnx.BatchStat))
    assert stats and {np.dtype(s.dtype) for s in stats} == {F32}
    graphdef, state = nnx.split(model)
    out = jax.eval_shape(
        lambda s, x: nnx.merge(graphdef, s)(x), state, jax.ShapeDtypeStruct((2, 8, 8, 1), F32)
    )
    assert out.shape == (2, 10)
    assert np.dtype(out.dtype) == policy.output_dtype


def test_named_output_dtypes():
    # The two cases people ask about: apex O2 returns fp16 logits, mixed_bf16 returns f32.
    assert PRESETS["O2"].output_dtype == F16
    assert PRESETS["mixed_bf16"].output_dtype == F32


# ---------------------------------------------------------------- the FP32_OPS table

# One small instance per class that claims an fp32 op; the input's channel count is 4.
_FP32_LAYER_FACTORIES = {
    nn.BatchNorm: lambda policy: nn.BatchNorm(4, policy=policy),
    nn.GroupNorm: lambda policy: nn.GroupNorm(2, 4, policy=policy),
    nn.AvgPool: lambda policy: nn.AvgPool(2, 1, 1, count_include_pad=False, policy=policy),
    nn.AdaptiveAvgPool: lambda policy: nn.AdaptiveAvgPool(3, policy=policy),
    nn.GlobalAvgPool: lambda policy: nn.GlobalAvgPool(policy=policy),
}


def _fp32_op_classes() -> dict[type, str]:
    return {
        obj: obj.fp32_op
        for obj in (getattr(nn, name) for name in nn.__all__)
        if inspect.isclass(obj) and isinstance(getattr(obj, "fp32_op", None), str)
    }


def test_fp32_op_names_are_in_the_table():
    claimed = _fp32_op_classes()
    assert claimed, "no layer claims an fp32 op"
    for cls, op in claimed.items():
        assert op in FP32_OPS, f"{cls.__name__}.fp32_op={op!r} is missing from FP32_OPS"
    # Every claiming class is exercised below; a new one must be added to the factories.
    assert set(claimed) == set(_FP32_LAYER_FACTORIES)


def test_every_table_entry_is_implemented():
    claimed = set(_fp32_op_classes().values())
    for op in FP32_OPS:
        assert op in claimed or op == "softmax_cross_entropy", f"{op} has no implementation"
    assert "softmax_cross_entropy" in FP32_OPS


def _origin_dtype(var, producers) -> np.dtype:
    """Dtype a value was computed in: look through convert_element_type to its source."""
    while var in producers and producers[var].primitive.name == "convert_element_type":
        var = producers[var].invars[0]
    return np.dtype(var.aval.dtype)


@pytest.mark.parametrize("cls", list(_FP32_LAYER_FACTORIES), ids=lambda c: c.__name__)
def test_fp32_ops_reduce_in_f32_under_mixed_bf16(cls):
    layer = _FP32_LAYER_FACTORIES[cls](get_policy("mixed_bf16"))
    x = jnp.ones((2, 5, 5, 4), BF16)  # what the layer receives in a bf16 model
    jaxpr = _layer_jaxpr(layer, x)
    stats = [e for e in _eqns(jaxpr) if e.primitive.name in STAT_PRIMITIVES]
    assert stats, f"{cls.__name__} has no reduction"
    for e in stats:
        assert set(_dtypes(e.invars)) == {F32}, (cls.__name__, e)
    # No arithmetic in half at all: the only half-precision equations are the casts of the
    # incoming activation to f32 and of the result back to the compute dtype, and BatchNorm's
    # oneDNN call (with the custom VJP and platform switch around it), which takes the half
    # activation and computes in float32 inside (tests/nn/test_onednn_norm.py checks its
    # float32 statistics against float64).
    for e in _eqns(jaxpr):
        if set(_dtypes(e.invars) + _dtypes(e.outvars)) & set(HALF):
            assert e.primitive.name == "convert_element_type" or _onednn_norm(e), (cls, e)
    assert jaxpr.outvars[0].aval.dtype == BF16


def _onednn_norm(eqn) -> bool:
    """``eqn`` is oneDNN's batch norm call or an equation holding one."""
    if eqn.primitive.name == "ffi_call":
        return eqn.params.get("target_name") == "layoutlab_onednn_batch_norm"
    return any(_onednn_norm(e) for sub in _sub_jaxprs(eqn.params) for e in _eqns(sub))


@pytest.mark.parametrize("cls", list(_FP32_LAYER_FACTORIES), ids=lambda c: c.__name__)
def test_fp32_ops_reduce_in_f16_under_O3(cls):
    layer = _FP32_LAYER_FACTORIES[cls](get_policy("O3"))
    x = jnp.ones((2, 5, 5, 4), F16)
    jaxpr = _layer_jaxpr(layer, x)
    producers = {v: e for e in _eqns(jaxpr) for v in e.outvars}
    stats = [e for e in _eqns(jaxpr) if e.primitive.name in STAT_PRIMITIVES]
    assert stats
    for e in stats:
        # jnp.mean/jnp.sum on half inputs keep their running sum in f32 and round the result
        # back to half, so a reduce_sum may read an f32 convert; the values it sums were
        # still rounded to f16 (the input, x - mean, its square), and so is the statistic.
        # GlobalAvgPool is a bare jnp.mean, so under O3 it differs from mixed precision only
        # by those two roundings.
        assert {_origin_dtype(v, producers) for v in e.invars} == {F16}, (cls.__name__, e)
        if e.primitive.name == "dot_general":
            assert np.dtype(e.params["preferred_element_type"]) == F16
    assert jaxpr.outvars[0].aval.dtype == F16


def test_cross_entropy_computes_in_f32():
    logits = jnp.ones((4, 10), BF16)
    labels = jnp.zeros((4,), jnp.int32)
    jaxpr = jax.make_jaxpr(cross_entropy)(logits, labels).jaxpr
    for e in _eqns(jaxpr):
        if BF16 in _dtypes(e.invars):
            assert e.primitive.name == "convert_element_type"
            assert _dtypes(e.outvars) == [F32]
    exps = [e for e in _eqns(jaxpr) if e.primitive.name in ("exp", "log", "reduce_sum")]
    assert exps and all(set(_dtypes(e.invars)) == {F32} for e in exps)
    assert jaxpr.outvars[0].aval.dtype == F32


# ---------------------------------------------------------------- numerics


def _bn_reference(x: np.ndarray, eps: float) -> np.ndarray:
    """Training-mode BatchNorm (biased variance, scale 1, bias 0) in float64, NHWC."""
    x = x.astype(np.float64)
    mean = x.mean(axis=(0, 1, 2))
    var = ((x - mean) ** 2).mean(axis=(0, 1, 2))
    return (x - mean) / np.sqrt(var + eps)


def test_batchnorm_large_mean_needs_f32_statistics():
    # Activations far from zero (mean 1000, std 1): the statistics must resolve 1e-3 of the
    # mean. The input values are rounded to f16 first so that every policy receives exactly
    # the same numbers (f16 values are exact in f32); only where the statistics are computed
    # differs.
    rng = np.random.default_rng(0)
    x = (1000.0 + rng.standard_normal((8, 4, 4, 3))).astype(np.float16).astype(np.float32)
    ref = _bn_reference(x, 1e-5)

    y_mixed = np.asarray(
        nn.BatchNorm(3, policy=get_policy("mixed_bf16"))(jnp.asarray(x)), np.float64
    )
    err_mixed = np.abs(y_mixed - ref)
    # Statistics in f32 (values ~1000 carry f32 spacing 6e-5, i.e. 6e-5 std) are accurate far
    # below what bf16 resolves; the bf16 output rounds to a relative 2^-8 (8 significant
    # bits). So the error bound is 2^-8 |y| plus 1e-3 for the f32 statistics (10x margin).
    assert np.all(err_mixed <= 2.0**-8 * np.abs(ref) + 1e-3), err_mixed.max()

    # apex O3 / fp32_ops=False: the mean of values ~1000 is an f16 number (spacing 0.5), so
    # each channel's output is shifted by up to 0.25 standard deviations (0.07 measured for
    # this seed). That shift is not rounding noise: its rms is >10x that of the bf16 output
    # rounding above (measured 0.048 vs 0.0015), even though O3 rounds its output to f16,
    # which is 8x finer than bf16.
    y_o3 = np.asarray(nn.BatchNorm(3, policy=get_policy("O3"))(jnp.asarray(x)), np.float64)
    err_o3 = np.abs(y_o3 - ref)
    assert err_o3.max() > 0.05
    rms = lambda e: float(np.sqrt(np.mean(np.square(e))))
    assert rms(err_o3) > 10 * rms(err_mixed)
