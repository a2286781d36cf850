"""compile_report on small convs: HLO counts checked against plain-text counts, XLA's cost and
memory analyses checked against analytic values, backends and per-compile flags."""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from layoutlab.xla import (
    BackendError,
    XlaFlagError,
    available_backends,
    compile_report,
    resolve_backend,
)
from layoutlab.xla.flags import parse_xla_flags

X_NCHW = jax.ShapeDtypeStruct((2, 3, 8, 8), jnp.float32)
W_OIHW = jax.ShapeDtypeStruct((4, 3, 3, 3), jnp.float32)
X_NHWC = jax.ShapeDtypeStruct((2, 8, 8, 3), jnp.float32)
W_HWIO = jax.ShapeDtypeStruct((3, 3, 3, 4), jnp.float32)


def conv_nchw(x, w):
    return lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW")
    )


def conv_nhwc(x, w):
    return lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def conv_nhwc_bf16(x, w):
    return lax.conv_general_dilated(
        x,
        w,
        (1, 1),
        "SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
        preferred_element_type=jnp.float32,
    )


@pytest.fixture(scope="module")
def nchw():
    return compile_report(conv_nchw, X_NCHW, W_OIHW, backend="cpu")


@pytest.fixture(scope="module")
def nhwc():
    return compile_report(conv_nhwc, X_NHWC, W_HWIO, backend="cpu")


def entry_block(text: str) -> str:
    return re.search(r"^ENTRY .*?^}", text, re.S | re.M).group(0)


def count_ops(text: str, opcode: str) -> int:
    return len(re.findall(rf" {opcode}\(", text))


def test_nhwc_conv_has_no_transposes(nhwc):
    assert count_ops(nhwc.hlo_text, "transpose") == 0  # plain-text check of the same claim
    assert nhwc.hlo.totals()["transposes"] == 0
    assert nhwc.hlo.memory_permutations == []
    (conv,) = nhwc.hlo.convolutions
    assert conv.physical == {"input": "NHWC", "kernel": "HWIO", "output": "NHWC"}


def test_nchw_conv_transposes_match_plain_text_counts(nchw):
    text = nchw.hlo_text
    total, top = count_ops(text, "transpose"), count_ops(entry_block(text), "transpose")
    assert total > 0
    t = nchw.hlo.totals()
    assert (t["transposes"], t["transposes_top_level"], t["transposes_nested"]) == (
        total,
        top,
        total - top,
    )
    # One transpose each for input, kernel and output; each reads and writes its array once.
    nbytes = 4 * (2 * 3 * 8 * 8 + 4 * 3 * 3 * 3 + 2 * 4 * 8 * 8)
    assert t["memory_permutation_bytes"] == 2 * nbytes
    # Written NCHW/OIHW, XLA's CPU conv runs physically NHWC/HWIO.
    (before,) = nchw.hlo_before.convolutions
    (after,) = nchw.hlo.convolutions
    assert (
        before.logical == before.physical == {"input": "NCHW", "kernel": "OIHW", "output": "NCHW"}
    )
    assert after.physical == {"input": "NHWC", "kernel": "HWIO", "output": "NHWC"}


def test_bf16_conv_is_converted_to_f32():
    x = jax.ShapeDtypeStruct((2, 8, 8, 3), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((3, 3, 3, 4), jnp.bfloat16)
    report = compile_report(conv_nhwc_bf16, x, w, backend="cpu")
    n_converts = count_ops(report.hlo_text, "convert")
    assert n_converts == len(report.hlo.converts) > 0
    assert report.hlo.conversions == {"bf16->f32": n_converts}
    (conv,) = report.hlo.convolutions
    assert (conv.lhs.dtype, conv.rhs.dtype, conv.out.dtype) == ("f32", "f32", "f32")
    (conv_before,) = report.hlo_before.convolutions
    assert (conv_before.lhs.dtype, conv_before.out.dtype) == ("bf16", "f32")


def _valid_taps(size: int, k: int, stride: int, pad_lo: int, out: int, dilation: int) -> int:
    """Kernel taps that land on real (non-padding) input, summed over output positions."""
    return sum(
        sum(1 for j in range(k) if 0 <= o * stride - pad_lo + j * dilation < size)
        for o in range(out)
    )


@pytest.mark.parametrize(
    "n, cin, cout, h, k, stride, groups, dilation",
    [(2, 3, 4, 8, 3, 1, 1, 1), (1, 4, 6, 9, 3, 2, 2, 1), (1, 2, 2, 9, 3, 1, 1, 2)],
)
def test_conv_flops_match_analytic_count(n, cin, cout, h, k, stride, groups, dilation):
    # XLA counts 2 flops (mul+add) per kernel tap that reads real input: taps on SAME padding
    # are not counted, so flops = 2*N*Cout*(Cin/groups)*prod_d(valid taps along d), which is
    # below the dense 2*N*Ho*Wo*Cout*Cin*Kh*Kw/groups whenever padding is used.
    def f(x, w):
        return lax.conv_general_dilated(
            x,
            w,
            (stride, stride),
            "SAME",
            rhs_dilation=(dilation, dilation),
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            feature_group_count=groups,
        )

    x = jax.ShapeDtypeStruct((n, h, h, cin), jnp.float32)
    w = jax.ShapeDtypeStruct((k, k, cin // groups, cout), jnp.float32)
    report = compile_report(f, x, w, backend="cpu")
    out = -(-h // stride)
    k_eff = (k - 1) * dilation + 1
    pad_lo = max((out - 1) * stride + k_eff - h, 0) // 2
    taps = _valid_taps(h, k, stride, pad_lo, out, dilation)
    expected = 2 * n * cout * (cin // groups) * taps * taps
    assert report.cost["flops"] == expected  # exact: XLA's count is an integer sum
    assert report.cost["flops"] <= 2 * n * out * out * cout * cin * k * k // groups


def test_memory_analysis_matches_argument_and_output_bytes(nchw):
    m = nchw.memory
    assert m["argument_size"] == X_NCHW.size * 4 + W_OIHW.size * 4
    assert m["output_size"] == 2 * 4 * 8 * 8 * 4
    assert m["alias_size"] == 0  # nothing donated
    assert m["temp_size"] >= 0 and m["generated_code_size"] >= 0


def test_donation_shows_as_aliased_bytes():
    report = compile_report(
        lambda x: x * 2.0, jax.ShapeDtypeStruct((16,), jnp.float32), donate_argnums=0
    )
    assert report.memory["alias_size"] == 16 * 4


def test_report_fields_and_json(nchw):
    assert nchw.backend == "cpu" and nchw.platform == "cpu"
    assert nchw.versions["jax"] == jax.__version__
    assert nchw.lower_seconds >= 0 and nchw.compile_seconds >= 0
    assert nchw.pre_hlo_text and "convolution(" in nchw.pre_hlo_text
    d = json.loads(json.dumps(nchw.to_dict()))
    assert d["hlo"]["totals"]["convolutions"] == 1
    assert "hlo_text" not in nchw.to_dict(include_text=False)
    assert "NHWC*HWIO->NHWC" in nchw.summary()


def test_concrete_arrays_and_jitted_functions_are_accepted():
    x = np.ones((2, 8, 8, 3), np.float32)
    w = np.ones((3, 3, 3, 4), np.float32)
    report = compile_report(jax.jit(conv_nhwc), x, w)
    np.testing.assert_array_equal(  # all-ones input: interior outputs are exactly 27
        np.asarray(report.run(x, w))[:, 1:-1, 1:-1, :], np.full((2, 6, 6, 4), 27.0, np.float32)
    )
    with pytest.raises(ValueError, match="already jitted"):
        compile_report(jax.jit(conv_nhwc), x, w, static_argnums=1)


def test_static_args_are_passed_through():
    def scale(x, n):
        return x * jnp.float32(n)

    report = compile_report(scale, np.ones(3, np.float32), 3, static_argnums=1)
    np.testing.assert_array_equal(np.asarray(report.run(np.ones(3, np.float32), 3)), [3, 3, 3])


def test_backends():
    assert "cpu" in available_backends()
    assert resolve_backend("cpu").platform == "cpu"
    with pytest.raises(BackendError, match="Available backends: .*cpu"):
        resolve_backend("not-a-backend")
    with pytest.raises(BackendError, match="backend must be a string"):
        resolve_backend(3)


def test_gpu_without_gpu_is_a_clear_error():
    if "gpu" in available_backends():
        pytest.skip("a GPU is present")
    with pytest.raises(BackendError, match="No GPU .*Available backends: cpu"):
        compile_report(conv_nhwc, X_NHWC, W_HWIO, backend="gpu")


def test_per_compile_flags_are_recorded_and_applied():
    x = jax.ShapeDtypeStruct((4, 8), jnp.float32)

    def identity(v):
        return v

    # XLA copies a returned parameter into a fresh output buffer; with every HLO pass off the
    # copy is never inserted, which shows the option reached this compile.
    plain = compile_report(identity, x)
    bare = compile_report(identity, x, flags={"--xla_disable_all_hlo_passes": True})
    assert plain.hlo.op_counts.get("copy") == 1
    assert "copy" not in bare.hlo.op_counts
    assert bare.flags["compiler_options"] == {"xla_disable_all_hlo_passes": True}
    assert bare.flags["XLA_FLAGS"] == parse_xla_flags()
    assert "xla_force_host_platform_device_count" in bare.flags["XLA_FLAGS"]  # from conftest


def test_bad_flags_are_clear_errors():
    x = jax.ShapeDtypeStruct((4,), jnp.float32)
    with pytest.raises(XlaFlagError, match="xla_no_such_flag.*xla_cpu_enable_fast_math"):
        compile_report(jnp.sin, x, flags={"xla_no_such_flag": 1})
    with pytest.raises(XlaFlagError, match="not a valid bool"):
        compile_report(jnp.sin, x, flags={"xla_cpu_enable_fast_math": "maybe"})
    with pytest.raises(XlaFlagError, match="bool, int, float or str"):
        compile_report(jnp.sin, x, flags={"xla_cpu_enable_fast_math": [1]})


def test_parse_xla_flags():
    assert parse_xla_flags("--a=1 --b --c='x y'") == {"a": "1", "b": "true", "c": "x y"}
