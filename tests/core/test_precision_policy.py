"""Precision policies: presets, jmp-style strings, errors, and which leaves get cast."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from layoutlab.precision import PRESETS, Policy, get_policy, parse_dtype

F32, F16, BF16 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(jnp.bfloat16)

# name: (params, compute, output, fp32_ops)
_EXPECTED = {
    "fp32": (F32, F32, F32, True),
    "bf16": (BF16, BF16, BF16, True),
    "fp16": (F16, F16, F16, True),
    "mixed_bf16": (F32, BF16, F32, True),
    "mixed_fp16": (F32, F16, F32, True),
    "O0": (F32, F32, F32, True),
    "O1": (F32, F16, F32, True),
    "O2": (F32, F16, F16, True),
    "O3": (F16, F16, F16, False),
}


def _dtypes(policy: Policy):
    return (policy.param_dtype, policy.compute_dtype, policy.output_dtype, policy.fp32_ops)


def test_every_preset_is_listed():
    assert set(PRESETS) == set(_EXPECTED)


@pytest.mark.parametrize("name", sorted(_EXPECTED))
def test_presets(name):
    policy = get_policy(name)
    assert _dtypes(policy) == _EXPECTED[name]
    assert get_policy(f"  {name.upper()} ") == policy
    assert get_policy(str(policy)) == policy  # __str__ is a valid policy name
    assert policy.needs_loss_scaling == (policy.compute_dtype == F16)
    assert policy.norm_dtype == (F32 if policy.fp32_ops else policy.compute_dtype)


def test_none_and_policy_pass_through():
    assert _dtypes(get_policy(None)) == _EXPECTED["fp32"]
    policy = Policy(F32, BF16, F32)
    assert get_policy(policy) is policy


@pytest.mark.parametrize(
    "name, expected",
    [
        ("params=float32,compute=bfloat16,output=float32", (F32, BF16, F32, True)),
        ("p=f32,c=bf16,o=f32", (F32, BF16, F32, True)),
        ("param=half,c=fp16,output=float", (F16, F16, F32, True)),
        (" P = BF16 , C = F16 ", (BF16, F16, F32, True)),
        ("c=bf16", (F32, BF16, F32, True)),  # unspecified dtypes are float32 (jmp: o=bf16)
        ("o=f16,p=f16", (F16, F32, F16, True)),
        ("c=f16,fp32_ops=false", (F32, F16, F32, False)),
        ("fp32_ops=TRUE", (F32, F32, F32, True)),
    ],
)
def test_jmp_style_strings(name, expected):
    assert _dtypes(get_policy(name)) == expected


@pytest.mark.parametrize(
    "name, match",
    [
        ("q=f32", "Unknown policy key 'q'"),
        ("params=f32,dtype=bf16", "Unknown policy key 'dtype'"),
        ("p=int8", "Unknown dtype 'int8'"),
        ("c=float8", "Unknown dtype 'float8'"),
        ("p=", "Unknown dtype ''"),
        ("params=f32,p=bf16", "given twice"),
        ("c=f16,compute=f16", "given twice"),
        ("p=f32,,c=bf16", "not of the form key=value"),
        ("p=f32,c", "not of the form key=value"),
        ("fp32_ops=maybe", "true or false"),
        ("fp8", "Unknown precision policy"),
        ("", "Unknown precision policy"),
    ],
)
def test_errors(name, match):
    with pytest.raises(ValueError, match=match):
        get_policy(name)


@pytest.mark.parametrize("value", [42, 1.0, ["fp32"], np.float32])
def test_non_str_policy(value):
    with pytest.raises(TypeError, match=r"a Policy or a policy name \(str\)"):
        get_policy(value)


def test_duplicate_fp32_ops_is_rejected():
    with pytest.raises(ValueError, match="given twice"):
        get_policy("fp32_ops=true,fp32_ops=false")


def test_policy_rejects_non_float_dtypes():
    with pytest.raises(ValueError, match="floating point"):
        Policy(param_dtype=jnp.int32)
    with pytest.raises(ValueError, match="Unknown dtype"):
        parse_dtype("int32")
    assert parse_dtype(jnp.bfloat16) == BF16
    assert parse_dtype(" FP16 ") == F16


def _mixed_tree():
    return {
        "f32": jnp.asarray([1.0 / 3.0, -2.5], jnp.float32),
        "f16": jnp.asarray([0.1], jnp.float16),
        "np_f32": np.asarray([1.0 / 3.0, 70000.0], np.float32),
        "int": jnp.asarray([1, 2**20 + 1], jnp.int32),
        "bool": jnp.asarray([True, False]),
        "np_uint8": np.asarray([255], np.uint8),
        "nested": [(jnp.asarray(5, jnp.int32), jnp.asarray(0.7, jnp.bfloat16))],
    }


@pytest.mark.parametrize("dtype", [BF16, F16, F32])
def test_casting_touches_only_floating_leaves(dtype):
    tree = _mixed_tree()
    policy = Policy(F32, dtype, F32)
    cast = jax.jit(policy.cast_to_compute)(tree)
    for key in ("f32", "f16", "np_f32"):
        assert cast[key].dtype == dtype
        # Reference: NumPy's (ml_dtypes') own rounding; 70000 overflows float16 to inf in both.
        with np.errstate(over="ignore"):
            expected = np.asarray(tree[key]).astype(dtype)
        np.testing.assert_array_equal(np.asarray(cast[key]), expected)
    assert cast["nested"][0][1].dtype == dtype
    for key in ("int", "bool", "np_uint8"):
        assert cast[key].dtype == np.asarray(tree[key]).dtype
        np.testing.assert_array_equal(np.asarray(cast[key]), np.asarray(tree[key]))
    assert cast["nested"][0][0].dtype == jnp.int32


def test_cast_directions():
    policy = get_policy("mixed_fp16")
    x = {"w": jnp.ones([2], jnp.bfloat16)}
    assert policy.cast_to_param(x)["w"].dtype == F32
    assert policy.cast_to_compute(x)["w"].dtype == F16
    assert policy.cast_to_output(x)["w"].dtype == F32
    assert policy.with_(output_dtype="bf16").cast_to_output(x)["w"].dtype == BF16


def test_float64_needs_x64_and_non_dtypes_are_clear_errors():
    with pytest.raises(ValueError, match="64-bit mode"):
        get_policy("p=f64")
    with pytest.raises(ValueError, match="is not a dtype"):
        Policy(param_dtype=3)


def test_numpy_scalars_are_cast():
    tree = {"s": np.float32(1.5), "i": np.int32(2)}
    out = get_policy("bf16").cast_to_compute(tree)
    assert out["s"].dtype == jnp.bfloat16 and out["i"].dtype == np.int32


@pytest.mark.parametrize(
    "name, ours, jmps",
    [
        ("c=bf16", (F32, BF16, F32), (F32, BF16, BF16)),
        ("p=bf16", (BF16, F32, F32), (BF16, BF16, BF16)),
        ("p=bf16,c=f16", (BF16, F16, F32), (BF16, F16, F16)),
        ("p=f32,c=bf16,o=bf16", (F32, BF16, BF16), (F32, BF16, BF16)),
    ],
)
def test_where_the_grammar_differs_from_jmp(name, ours, jmps):
    """A dtype left out is float32 here; in jmp (``jmp._src.policy.get_policy``) the compute
    dtype follows the params and the output follows the compute, as ``jmps`` writes out. All
    three given, both read the same. get_policy's docstring and the precision guide say so."""
    assert _dtypes(get_policy(name))[:3] == ours
    given = dict(part.split("=") for part in name.split(","))
    p = {"f32": F32, "bf16": BF16, "f16": F16}[given.get("p", "f32")]
    c = {"f32": F32, "bf16": BF16, "f16": F16}[given["c"]] if "c" in given else p
    o = {"f32": F32, "bf16": BF16, "f16": F16}[given["o"]] if "o" in given else c
    assert (p, c, o) == jmps


def test_half_and_bare_dtypes_are_not_jmps():
    assert _dtypes(get_policy("p=half,c=half,o=half"))[:3] == (F16, F16, F16)  # on any backend
    with pytest.raises(ValueError, match="Unknown precision policy 'f32'"):
        get_policy("f32")


def test_the_jmp_difference_is_documented():
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[2] / "docs/guides/precision.md").read_text()
    for text in (get_policy.__doc__, guide):
        assert '"c=bf16"' in text and "jmp" in text
        assert "output **float32** here" in " ".join(text.split())
