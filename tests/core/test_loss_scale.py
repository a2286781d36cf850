"""Loss scales: pytree round trips, GradScaler-equivalent dynamics, scale/unscale dtypes."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from layoutlab.loss_scale import (
    DynamicLossScale,
    NoOpLossScale,
    StaticLossScale,
    all_finite,
    get_loss_scale,
)

F32_MAX = float(np.finfo(np.float32).max)


def _fields(obj) -> dict:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def _assert_same_fields(a, b):
    assert type(a) is type(b)
    fa, fb = _fields(a), _fields(b)
    assert fa.keys() == fb.keys()
    for name in fa:
        np.testing.assert_array_equal(np.asarray(fa[name]), np.asarray(fb[name]), err_msg=name)
        assert np.asarray(fa[name]).dtype == np.asarray(fb[name]).dtype, name


# --- pytree structure ---------------------------------------------------------------------


def _odd_dynamic() -> DynamicLossScale:
    # Every hyperparameter away from its default, so a dropped field would show.
    return DynamicLossScale(
        loss_scale=2.0**10,
        counter=2,
        period=7,
        factor=3.0,
        backoff=0.25,
        min_loss_scale=0.5,
        max_loss_scale=2.0**20,
    )


@pytest.mark.parametrize(
    "loss_scale",
    [NoOpLossScale(), StaticLossScale(123.0), _odd_dynamic()],
    ids=["noop", "static", "dynamic"],
)
def test_jit_round_trip_keeps_every_field(loss_scale):
    _assert_same_fields(jax.jit(lambda s: s)(loss_scale), loss_scale)
    _assert_same_fields(jax.tree.map(lambda x: x, loss_scale), loss_scale)


def test_hyperparameters_are_static_and_survive_adjust_under_jit():
    ls = _odd_dynamic()
    assert len(jax.tree.leaves(ls)) == 2  # only loss_scale and counter are traced
    out = jax.jit(lambda s: s.adjust(jnp.asarray(True)))(ls)
    for name in ("period", "factor", "backoff", "min_loss_scale", "max_loss_scale"):
        assert getattr(out, name) == getattr(ls, name), name
    assert int(out.counter) == 3
    assert out.loss_scale.dtype == jnp.float32 and out.counter.dtype == jnp.int32


def test_defaults_match_grad_scaler():
    torch = pytest.importorskip("torch")
    scaler = torch.amp.GradScaler("cpu")
    ls = DynamicLossScale()
    assert float(ls.loss_scale) == scaler.get_scale() == 2.0**16
    assert ls.factor == scaler.get_growth_factor()
    assert ls.backoff == scaler.get_backoff_factor()
    assert ls.period == scaler.get_growth_interval() == 2000


# --- dynamics ------------------------------------------------------------------------------


@jax.jit
def _jax_trajectory(ls, flags):
    def body(ls, finite):
        ls = ls.adjust(finite)
        return ls, (ls.loss_scale, ls.counter)

    return jax.lax.scan(body, ls, flags)[1]


def _python_trajectory(flags, ls):
    """GradScaler's rule in plain Python (float32 scale, double-precision factors), plus the
    [min, max] clamp."""
    scale, counter, out = np.float32(ls.loss_scale), int(ls.counter), []
    with np.errstate(over="ignore"):
        for finite in flags:
            if not finite:
                scale, counter = np.float32(float(scale) * ls.backoff), 0
            elif counter + 1 == ls.period:
                grown = np.float32(float(scale) * ls.factor)
                scale, counter = (grown if np.isfinite(grown) else scale), 0
            else:
                counter += 1
            scale = np.float32(min(max(float(scale), ls.min_loss_scale), ls.max_loss_scale))
            out.append((scale, counter))
    return out


def _torch_trajectory(flags, ls):
    torch = pytest.importorskip("torch")
    scale = torch.full((), float(ls.loss_scale), dtype=torch.float32)
    tracker = torch.full((), int(ls.counter), dtype=torch.int32)
    out = []
    for finite in flags:
        found_inf = torch.full((), 0.0 if finite else 1.0, dtype=torch.float32)
        torch._amp_update_scale_(scale, tracker, found_inf, ls.factor, ls.backoff, ls.period)
        out.append((np.float32(scale.item()), int(tracker.item())))
    return out


# Growth after exactly 3 clean steps, backoff resets the counter mid-run, repeated backoffs.
_SCRIPT = [True] * 3 + [True, False] + [True] * 2 + [False] + [True] * 6 + [False] * 3 + [True] * 4

# min/max far away so that the clamp never acts: GradScaler has none.
_UNCLAMPED = dict(period=3, min_loss_scale=2.0**-60, max_loss_scale=F32_MAX)


@pytest.mark.parametrize(
    "ls",
    [
        DynamicLossScale(loss_scale=2.0**16, **_UNCLAMPED),
        # Non-power-of-two factors that float32 represents exactly.
        DynamicLossScale(loss_scale=1000.0, factor=1.5, backoff=0.75, **_UNCLAMPED),
        # Growth would overflow float32: GradScaler keeps the old scale.
        DynamicLossScale(loss_scale=2.0**127, **_UNCLAMPED),
    ],
    ids=["pow2", "factor1.5", "near-overflow"],
)
def test_trajectory_matches_grad_scaler_exactly(ls):
    scales, counters = _jax_trajectory(ls, jnp.asarray(_SCRIPT))
    got = list(zip(np.asarray(scales), np.asarray(counters).tolist(), strict=True))
    # Exact equality: the same float32 multiplications happen in the same order.
    assert got == _torch_trajectory(_SCRIPT, ls)
    assert got == _python_trajectory(_SCRIPT, ls)


def test_trajectory_landmarks():
    ls = DynamicLossScale(loss_scale=2.0**16, **_UNCLAMPED)
    scales, counters = _jax_trajectory(ls, jnp.asarray(_SCRIPT))
    scales, counters = np.asarray(scales), np.asarray(counters)
    assert scales[1] == 2.0**16 and counters[1] == 2
    assert scales[2] == 2.0**17 and counters[2] == 0  # grown after exactly `period` clean steps
    assert scales[4] == 2.0**16 and counters[4] == 0  # backoff, counter reset
    assert scales[6] == 2.0**16 and counters[6] == 2  # no growth: the run was interrupted


@pytest.mark.parametrize(
    "ls, flags, expected_scales",
    [
        (DynamicLossScale(loss_scale=2.0, period=3), [False] * 3, [1.0, 1.0, 1.0]),
        (DynamicLossScale(loss_scale=2.0**24, period=1), [True] * 2, [2.0**24] * 2),
        (DynamicLossScale(loss_scale=64.0, period=1, max_loss_scale=100.0), [True], [100.0]),
        (
            DynamicLossScale(loss_scale=4.0, period=2, min_loss_scale=3.0),
            [False, True, True, False],
            [3.0, 3.0, 6.0, 3.0],
        ),
    ],
    ids=["min", "max-default", "max-odd", "min-then-grow"],
)
def test_clamps(ls, flags, expected_scales):
    scales, _ = _jax_trajectory(ls, jnp.asarray(flags))
    np.testing.assert_array_equal(np.asarray(scales), np.float32(expected_scales))
    assert [s for s, _ in _python_trajectory(flags, ls)] == list(np.float32(expected_scales))


def test_default_period_grows_at_step_2000():
    ls = DynamicLossScale()
    scales, counters = _jax_trajectory(ls, jnp.ones([2000], jnp.bool_))
    assert float(scales[1998]) == 2.0**16 and int(counters[1998]) == 1999
    assert float(scales[1999]) == 2.0**17 and int(counters[1999]) == 0


def test_static_and_noop_never_change():
    for ls in (StaticLossScale(512.0), NoOpLossScale()):
        for finite in (True, False):
            assert ls.adjust(jnp.asarray(finite)) is ls


def test_adjust_rejects_non_bool():
    with pytest.raises(ValueError, match="bool scalar"):
        DynamicLossScale().adjust(jnp.ones([2], jnp.bool_))
    with pytest.raises(ValueError, match="bool scalar"):
        DynamicLossScale().adjust(jnp.asarray(1.0))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(factor=1.0), "factor"),
        (dict(backoff=1.0), "backoff"),
        (dict(backoff=0.0), "backoff"),
        (dict(period=0), "period"),
        (dict(period=2.5), "period"),
        (dict(min_loss_scale=4.0, max_loss_scale=2.0), "min_loss_scale"),
        (dict(max_loss_scale=float("inf")), "max_loss_scale"),
        (dict(max_loss_scale=1e39), "max_loss_scale"),
        (dict(loss_scale=0.0), "loss_scale"),
        (dict(loss_scale=2.0**30), "outside"),
        (dict(counter=2000), "counter"),
        (dict(factor="2"), "factor"),
    ],
)
def test_bad_hyperparameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DynamicLossScale(**kwargs)


# --- scale / unscale -----------------------------------------------------------------------


def _tree():
    return {
        "f32": jnp.asarray([1.5, -3.0, 0.1], jnp.float32),
        "f16": jnp.asarray([0.25, -(2.0**-20), 0.1], jnp.float16),
        "bf16": jnp.asarray([3.0, -0.1], jnp.bfloat16),
        "nested": [(jnp.asarray(7, jnp.int32), jnp.asarray([True, False]))],
    }


def test_scale_keeps_dtypes_and_multiplies_exactly():
    tree = _tree()
    scaled = jax.jit(StaticLossScale(2.0**10).scale)(tree)
    for key in ("f32", "f16", "bf16"):
        assert scaled[key].dtype == tree[key].dtype
        # A power-of-two scale is exact in every float format (no overflow at these values).
        np.testing.assert_array_equal(
            np.asarray(scaled[key], np.float64), np.asarray(tree[key], np.float64) * 2**10
        )
    np.testing.assert_array_equal(scaled["nested"][0][0], tree["nested"][0][0])
    np.testing.assert_array_equal(scaled["nested"][0][1], tree["nested"][0][1])
    assert scaled["nested"][0][0].dtype == jnp.int32
    assert scaled["nested"][0][1].dtype == jnp.bool_


def test_unscale_upcasts_half_and_round_trips_exactly():
    ls = DynamicLossScale(loss_scale=2.0**12)
    tree = _tree()
    back = jax.jit(lambda t: ls.unscale(ls.scale(t)))(tree)
    for key in ("f32", "f16", "bf16"):
        assert back[key].dtype == jnp.float32
        np.testing.assert_array_equal(back[key], np.asarray(tree[key], np.float32))
    kept = ls.unscale(ls.scale(tree), keep_dtype=True)
    for key in ("f16", "bf16"):
        assert kept[key].dtype == tree[key].dtype
        np.testing.assert_array_equal(kept[key], tree[key])
    assert back["nested"][0][0].dtype == jnp.int32


def test_unscale_rescues_what_half_precision_would_flush():
    # 2**-26 is below float16's smallest subnormal (2**-24): scaled by 2**16 it is 2**-10.
    ls = StaticLossScale(2.0**16)
    grad = jnp.asarray([2.0**-10], jnp.float16)
    assert float(ls.unscale(grad)[0]) == 2.0**-26
    assert float(ls.unscale(grad, keep_dtype=True)[0]) == 0.0


def test_non_power_of_two_round_trip():
    ls = StaticLossScale(1000.0)
    x = jnp.asarray([1.5, -3.0, 0.1, 7e-3], jnp.float32)
    back = ls.unscale(ls.scale(x))
    # Two float32 roundings (times 1000, times float32(1/1000)): at most a few ulp.
    np.testing.assert_allclose(np.asarray(back), np.asarray(x), rtol=4 * 2.0**-23, atol=0)


def test_scale_of_half_overflows_to_inf_not_before():
    ls = StaticLossScale(2.0**16)  # 65536 itself overflows float16 (max 65504)
    small = ls.scale(jnp.asarray([2.0**-10], jnp.float16))
    assert float(small[0]) == 64.0
    big = ls.scale(jnp.asarray([2.0], jnp.float16))
    assert bool(jnp.isinf(big[0])) and not bool(all_finite(big))


def test_noop_scale_is_identity_and_unscale_upcasts():
    tree = _tree()
    ls = NoOpLossScale()
    assert ls.scale(tree) is tree
    out = ls.unscale(tree)
    assert out["f16"].dtype == jnp.float32
    np.testing.assert_array_equal(out["f16"], np.asarray(tree["f16"], np.float32))
    np.testing.assert_array_equal(out["f32"], tree["f32"])
    assert float(ls.loss_scale) == 1.0


# --- all_finite ----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
def test_all_finite_finds_bad_values_deep_in_a_tree(bad, dtype):
    leaf = jnp.asarray([1.0, 2.0, 3.0], dtype)
    tree = {"a": [jnp.ones([2]), (jnp.arange(3), {"b": leaf})], "c": jnp.zeros([])}
    assert bool(all_finite(tree))
    tree["a"][1][1]["b"] = leaf.at[1].set(bad)
    result = jax.jit(all_finite)(tree)
    assert result.dtype == jnp.bool_ and result.shape == ()
    assert not bool(result)


def test_all_finite_ignores_integer_and_bool_leaves():
    tree = {"i": jnp.asarray([np.iinfo(np.int32).max], jnp.int32), "b": jnp.asarray([True])}
    assert bool(all_finite(tree))
    assert bool(all_finite({}))
    assert not bool(all_finite({"x": float("nan")}))


# --- get_loss_scale ------------------------------------------------------------------------


def test_get_loss_scale_forms():
    assert isinstance(get_loss_scale(None), NoOpLossScale)
    assert isinstance(get_loss_scale(" None "), NoOpLossScale)
    static = get_loss_scale("static:1024")
    assert isinstance(static, StaticLossScale) and float(static.loss_scale) == 1024.0
    dyn = get_loss_scale("Dynamic")
    assert isinstance(dyn, DynamicLossScale) and float(dyn.loss_scale) == 2.0**16
    dyn = get_loss_scale("dynamic:4096")
    assert float(dyn.loss_scale) == 4096.0 and dyn.period == 2000
    assert get_loss_scale(static) is static


@pytest.mark.parametrize(
    "name, match",
    [
        ("static", "needs a value"),
        ("static:", "needs a value"),
        ("static:abc", "not a number"),
        ("static:-1", "positive"),
        ("static:inf", "positive"),
        ("static:1e39", "float32"),
        ("dynamic:", "empty value"),
        ("dynamic:0", "positive"),
        ("none:3", "Unknown loss scale"),
        ("bogus", "Unknown loss scale"),
        ("", "Unknown loss scale"),
    ],
)
def test_get_loss_scale_errors(name, match):
    with pytest.raises(ValueError, match=match):
        get_loss_scale(name)


def test_get_loss_scale_non_str():
    with pytest.raises(TypeError, match=r"a LossScale or a loss-scale name \(str\)"):
        get_loss_scale(1024)
