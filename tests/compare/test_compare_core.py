"""Tolerances, array reports and pytree reports of layoutlab.compare.

Expected values here are planted by hand (known errors at known places), so the checks are
exact or use a float64-rounding-sized tolerance stated where used.
"""

import json
import math

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from layoutlab.compare import (
    CompareReport,
    ShapeMismatchError,
    Tolerance,
    TreeReport,
    TreeStructureError,
    assert_close,
    assert_trees_close,
    compare,
    compare_trees,
    default_tolerance,
    scaled,
)
from layoutlab.compare.tolerance import resolve_tolerance

# Planted errors are computed in float64, e.g. (e + 0.5) - e, which rounds at ~1e-16 relative.
F64_ROUNDING = 1e-12


@pytest.mark.parametrize(
    "dtype, expected",
    [
        (np.float64, (1e-7, 1e-7)),
        (np.float32, (1.3e-6, 1e-5)),
        (jnp.bfloat16, (1.6e-2, 1e-5)),
        (ml_dtypes.bfloat16, (1.6e-2, 1e-5)),
        (np.float16, (1e-3, 1e-5)),
        (np.int32, (0.0, 0.0)),
        (np.bool_, (0.0, 0.0)),
    ],
)
def test_default_tolerance_table(dtype, expected):
    assert default_tolerance(dtype) == Tolerance(*expected)


def test_default_tolerance_takes_the_looser_of_two():
    assert default_tolerance(np.float32, jnp.bfloat16) == Tolerance(1.6e-2, 1e-5)
    assert default_tolerance(np.float64, np.float32) == Tolerance(1.3e-6, 1e-5)
    # rtol and atol are each the max: float16's rtol with float64's larger atol.
    assert default_tolerance(np.float64, np.float16) == Tolerance(1e-3, 1e-5)
    assert default_tolerance(np.int32, np.float16) == Tolerance(1e-3, 1e-5)
    with pytest.raises(ValueError, match="at least one dtype"):
        default_tolerance()


def test_resolve_tolerance_needs_both_or_neither():
    with pytest.raises(ValueError, match="give both rtol and atol, or neither"):
        resolve_tolerance(rtol=1e-3)
    with pytest.raises(ValueError, match="Only atol was given"):
        resolve_tolerance(atol=1e-3, dtypes=(np.float32,))
    assert resolve_tolerance(1e-3, 0.0, dtypes=(np.float32,)) == Tolerance(1e-3, 0.0)
    assert resolve_tolerance(dtypes=(np.float16,)) == Tolerance(1e-3, 1e-5)
    with pytest.raises(ValueError, match="rtol must be a finite number >= 0"):
        resolve_tolerance(-1.0, 0.0)


def test_scaled_multiplies_both():
    tol = scaled(default_tolerance(jnp.bfloat16), 4)
    assert tol.rtol == pytest.approx(6.4e-2) and tol.atol == pytest.approx(4e-5)
    assert Tolerance(1.0, 2.0).scaled(0.5) == Tolerance(0.5, 1.0)
    with pytest.raises(ValueError, match="factor"):
        scaled(tol, 0)


def planted():
    expected = np.linspace(1.0, 2.0, 24).reshape(2, 3, 4)
    expected[0, 0, 0] = 1e-3
    actual = expected.copy()
    actual[0, 0, 0] = 2e-3  # abs 1e-3, rel 1.0: the max relative error
    actual[0, 1, 1] += 1e-3
    actual[1, 2, 3] += 0.5  # the max absolute error
    return actual, expected


def test_report_fields_on_planted_errors():
    actual, expected = planted()
    r = compare(actual, expected, name="planted")
    assert not r.passed
    assert (r.shape, r.size, r.actual_dtype, r.expected_dtype) == (
        (2, 3, 4),
        24,
        "float64",
        "float64",
    )
    assert (r.rtol, r.atol, r.tolerance_source) == (1e-7, 1e-7, "default")
    assert r.max_abs_error == pytest.approx(0.5, rel=F64_ROUNDING)
    assert r.max_abs_index == (1, 2, 3)
    assert r.max_abs_expected == 2.0 and r.max_abs_actual == 2.5
    assert r.max_rel_error == pytest.approx(1.0, rel=F64_ROUNDING)
    assert r.max_rel_index == (0, 0, 0)
    assert r.mismatches == 3 and r.mismatch_percent == pytest.approx(12.5)
    assert r.first_mismatch_index == (0, 0, 0)
    assert r.ulp_dtype == "float64"
    assert (r.nan_actual, r.nan_expected, r.inf_actual, r.inf_expected) == (0, 0, 0, 0)


def test_given_tolerance_changes_the_verdict():
    actual, expected = planted()
    r = compare(actual, expected, rtol=0.0, atol=1.1e-3)
    assert r.tolerance_source == "given"
    assert r.mismatches == 1 and r.first_mismatch_index == (1, 2, 3)
    assert compare(actual, expected, rtol=1.0, atol=0.0).passed


def nudge(value, dtype, ulps):
    x = np.asarray(value, dtype=dtype)
    for _ in range(ulps):
        x = np.nextafter(x, np.asarray(np.inf, dtype=dtype))
    return x


def test_float32_off_by_three_ulps_reports_three():
    expected = np.array([1.5, 0.75, -3.0], np.float32)
    actual = expected.copy()
    actual[1] = nudge(0.75, np.float32, 3)
    r = compare(actual, expected)
    assert r.ulp_dtype == "float32"
    assert r.max_ulp_error == 3.0
    # A float64 expected value counts ULPs in the less precise float32.
    r64 = compare(actual, expected.astype(np.float64))
    assert r64.ulp_dtype == "float32" and r64.max_ulp_error == 3.0


def test_float16_ulps_and_tolerance():
    expected = np.array([0.1, 1.0, 100.0], np.float32)
    actual = expected.astype(np.float16)
    actual[2] = nudge(100.0, np.float16, 2)
    r = compare(actual, expected)
    assert r.ulp_dtype == "float16" and r.max_ulp_error == 2.0
    # float16 spacing at 100 is 1/16; 2 ulps = 0.125 > 1e-5 + 1e-3 * 100.
    assert not r.passed and r.max_abs_index == (2,)


def test_bfloat16_inputs():
    expected = jnp.asarray([1.0, 2.0, 0.5], jnp.float32)
    one_ulp = jnp.asarray([1.0 + 2.0**-7, 2.0, 0.5], jnp.bfloat16)  # bf16 spacing at 1 is 2**-7
    r = compare(one_ulp, expected)
    assert (r.actual_dtype, r.expected_dtype, r.ulp_dtype) == ("bfloat16", "float32", "bfloat16")
    assert r.max_ulp_error == 1.0 and r.max_abs_error == 2.0**-7
    assert r.passed  # 2**-7 = 0.0078 relative, within bfloat16's rtol 1.6e-2
    three_ulps = jnp.asarray([1.0 + 3 * 2.0**-7, 2.0, 0.5], jnp.bfloat16)
    r3 = compare(three_ulps, expected)
    assert r3.max_ulp_error == 3.0 and not r3.passed


def test_cosine_similarity():
    def cos(a, e):
        return compare(np.array(a), np.array(e)).cosine_similarity

    assert cos([1.0, 1.0], [1.0, 0.0]) == pytest.approx(1 / math.sqrt(2), rel=F64_ROUNDING)
    assert cos([2.0, 4.0], [1.0, 2.0]) == pytest.approx(1.0, rel=F64_ROUNDING)
    assert cos([-1.0, 3.0], [1.0, -3.0]) == pytest.approx(-1.0, rel=F64_ROUNDING)
    assert cos([0.0, 0.0], [0.0, 0.0]) == 1.0
    assert cos([0.0, 0.0], [1.0, 0.0]) == 0.0
    # Huge float64 values must not overflow the dot product.
    assert cos([1e300, 1e300], [1e300, 1e300]) == pytest.approx(1.0, rel=F64_ROUNDING)


def test_nan_positions_must_match():
    both = compare(np.array([1.0, np.nan, 3.0]), np.array([1.0, np.nan, 3.0]))
    assert both.passed and (both.nan_actual, both.nan_expected) == (1, 1)
    assert both.cosine_similarity == pytest.approx(1.0, rel=F64_ROUNDING)

    strict = compare(np.array([1.0, np.nan]), np.array([1.0, np.nan]), equal_nan=False)
    assert not strict.passed and strict.nonfinite_mismatches == 1

    one_side = compare(np.array([1.0, np.nan, 3.0]), np.array([1.0, 2.0, 3.0]))
    assert not one_side.passed
    assert (one_side.mismatches, one_side.nonfinite_mismatches) == (1, 1)
    assert one_side.first_mismatch_index == (1,)
    assert one_side.max_abs_error == 0.0  # statistics cover finite pairs only
    assert "non-finite mismatches" in str(one_side)


def test_infinities():
    inf = np.inf
    same = compare(np.array([inf, -inf, 1.0]), np.array([inf, -inf, 1.0]))
    assert same.passed and (same.inf_actual, same.inf_expected) == (2, 2)
    flipped = compare(np.array([inf, 1.0]), np.array([-inf, 1.0]))
    assert not flipped.passed and flipped.first_mismatch_index == (0,)
    vs_finite = compare(np.array([1.0, 2.0]), np.array([1.0, inf]))
    assert not vs_finite.passed and vs_finite.inf_expected == 1 and vs_finite.inf_actual == 0


def test_integers_compare_exactly():
    r = compare(np.array([1, 2, 3]), np.array([1, 2, 4]))
    assert not r.passed and r.mismatches == 1 and (r.rtol, r.atol) == (0.0, 0.0)
    assert r.ulp_dtype is None and r.max_ulp_error is None
    # float64 cannot tell these apart; the exact integer path can.
    big = compare(np.array([2**53 + 1], np.int64), np.array([2**53], np.int64))
    assert not big.passed
    assert compare(np.array([True, False]), np.array([True, False])).passed


def test_shape_mismatch_names_both_shapes():
    with pytest.raises(
        ShapeMismatchError, match=r"actual has shape \(2, 3\), expected has shape \(3, 2\)"
    ) as info:
        compare(np.zeros((2, 3)), np.zeros((3, 2)), name="w")
    assert isinstance(info.value, ValueError)
    assert "w:" in str(info.value) and "to_layout" in str(info.value)


def test_unsupported_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="complex"):
        compare(np.zeros(2, np.complex64), np.zeros(2, np.complex64))


def test_json_round_trip_with_non_finite_values():
    r = compare(np.array([1.0, np.nan]), np.array([0.0, np.nan]))  # rel error 1/0 = inf
    d = r.to_dict()
    assert d["max_rel_error"] == "inf" and d["max_rel_index"] == [0]
    assert json.loads(r.to_json()) == d
    assert CompareReport.from_dict(json.loads(r.to_json())) == r


def test_report_prints_a_table():
    actual, expected = planted()
    text = str(compare(actual, expected, name="planted"))
    assert text.splitlines()[0] == "compare 'planted': FAILED (3 of 24 elements outside tolerance)"
    for label in (
        "max abs error",
        "max rel error",
        "max ULP error",
        "cosine similarity",
        "mismatches",
    ):
        assert label in text


def test_assert_close_message():
    actual = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
    expected = actual.copy()
    expected[1, 2] = 6.5
    with pytest.raises(AssertionError) as info:
        assert_close(actual, expected, msg="after layer 3", name="conv3")
    text = str(info.value)
    assert text.startswith("after layer 3\ncompare 'conv3': FAILED (1 of 6 elements")
    assert "at (1, 2): actual 6, expected 6.5" in text
    assert "rtol 1.3e-06, atol 1e-05 (default)" in text
    assert assert_close(actual, actual).passed


def make_tree(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "conv": {
            "kernel": rng.standard_normal((3, 3, 2, 4)).astype(np.float32),
            "bias": np.zeros(4, np.float32),
        },
        "head": [rng.standard_normal((4, 2)), np.arange(3)],
    }


def test_compare_trees_rows_and_first_failure():
    expected = make_tree()
    actual = make_tree()
    actual["head"][0] = actual["head"][0] + 1.0
    actual["conv"]["kernel"] = actual["conv"]["kernel"] * np.float32(1.01)
    report = compare_trees(actual, expected)
    assert [r.name for r in report.leaves] == [
        "['conv']['bias']",
        "['conv']['kernel']",
        "['head'][0]",
        "['head'][1]",
    ]
    assert not report.passed and len(report.failures) == 2
    # Flatten order (sorted dict keys) decides which failure comes first.
    assert report.first_failure.name == "['conv']['kernel']"
    assert report["['head'][1]"].passed and report["['head'][1]"].rtol == 0.0
    text = str(report)
    assert "First failing leaf: ['conv']['kernel']" in text
    assert "compare_trees: FAILED (2 of 4 leaves)" in text
    d = json.loads(report.to_json())
    assert d["first_failure"] == "['conv']['kernel']" and d["num_failed"] == 2
    assert TreeReport.from_dict(d) == report


def test_assert_trees_close():
    assert assert_trees_close(make_tree(), make_tree()).passed
    actual = make_tree()
    actual["conv"]["bias"] = actual["conv"]["bias"] + np.float32(1e-3)
    with pytest.raises(AssertionError, match=r"First failing leaf: \['conv'\]\['bias'\]"):
        assert_trees_close(actual, make_tree(), msg="params")


def test_tree_structure_mismatch_says_where():
    expected = make_tree()
    missing = make_tree()
    del missing["conv"]["bias"]
    with pytest.raises(TreeStructureError, match=r"Missing in actual \(1\): \['conv'\]\['bias'\]"):
        compare_trees(missing, expected)

    extra = make_tree()
    extra["bn"] = {"scale": np.ones(4)}
    with pytest.raises(TreeStructureError) as info:
        compare_trees(extra, expected)
    assert "Extra in actual (1): ['bn']['scale']" in str(info.value)
    assert "First difference at leaf #0: actual ['bn']['scale'], expected ['conv']['bias']" in str(
        info.value
    )

    as_tuple = make_tree()
    as_tuple["head"] = tuple(as_tuple["head"])
    with pytest.raises(TreeStructureError, match="different node types"):
        compare_trees(as_tuple, expected)


def test_tree_leaf_shape_mismatch_names_the_leaf():
    actual = make_tree()
    actual["head"][0] = actual["head"][0].T
    with pytest.raises(ShapeMismatchError, match=r"\['head'\]\[0\]: shape mismatch"):
        compare_trees(actual, make_tree())


def test_nnx_state_against_pure_dict():
    nnx = pytest.importorskip("flax.nnx")
    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    state = nnx.state(model)
    pure = nnx.to_pure_dict(state)
    assert compare_trees(state, pure).passed
    changed = {"bias": np.asarray(pure["bias"]) + np.float32(0.5), "kernel": pure["kernel"]}
    report = compare_trees(state, changed)
    assert report.first_failure.name == "['bias']"
    assert report["['bias']"].max_abs_error == 0.5


def test_tree_with_prng_key_leaf():
    nnx = pytest.importorskip("flax.nnx")
    dropout = nnx.Dropout(0.5, rngs=nnx.Rngs(1))
    report = compare_trees(nnx.state(dropout), nnx.state(dropout))
    assert report.passed and len(report.leaves) == 2
