"""The HLO report counts the convs that run as oneDNN calls (custom-calls ``layoutlab_onednn_*``)
by kind, beside XLA's own convs, which keep their layout rows to themselves.

The program is lowered, not compiled: the targets are not registered in this process, and the
pre-optimization HLO spells the custom-calls as the compiled one does.
"""

import functools

import jax
import jax.numpy as jnp
from onednn_helpers import needs_onednn

from layoutlab.xla.hlo import hlo_report
from layoutlab.xla.hlo_extract import onednn_kind

DN = ("NHWC", "HWIO", "NHWC")


def _program_text() -> str:
    x = jax.ShapeDtypeStruct((2, 8, 8, 4), jnp.float32)
    w = jax.ShapeDtypeStruct((3, 3, 4, 8), jnp.float32)

    def step(x, w):
        y = jax.ffi.ffi_call(
            "layoutlab_onednn_conv_fwd", jax.ShapeDtypeStruct((2, 8, 8, 8), x.dtype)
        )(x, w)
        dx = jax.ffi.ffi_call("layoutlab_onednn_conv_bwd_data", x)(y, w)
        dw = jax.ffi.ffi_call("layoutlab_onednn_conv_bwd_weights", w)(x, y)
        z = jax.lax.conv_general_dilated(dx, dw, (1, 1), "SAME", dimension_numbers=DN)
        return jax.ffi.ffi_call("other_conv_kernel", z)(z)

    return jax.jit(step).lower(x, w).as_text(dialect="hlo")


def test_onednn_calls_are_counted_by_kind_beside_xlas_convs():
    report = hlo_report(_program_text())
    assert report.onednn_convs() == {"forward": 1, "backward data": 1, "backward weights": 1}
    # XLA's conv, and a foreign conv kernel that is not oneDNN's, stay convolutions.
    assert [c.opcode for c in report.convolutions] == ["convolution", "custom-call"]
    t = report.totals()
    assert (t["convolutions"], t["onednn_convs"], t["custom_calls"]) == (2, 3, 4)
    assert report.to_dict()["onednn_convs"] == report.onednn_convs()
    assert "oneDNN convs: 3 (forward 1, backward data 1, backward weights 1)" in report.summary()


def test_no_onednn_calls_reads_zero():
    x = jnp.ones((1, 4, 4, 2))
    w = jnp.ones((3, 3, 2, 2))
    text = jax.jit(
        lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=DN)
    ).lower(x, w)
    report = hlo_report(text.as_text(dialect="hlo"))
    assert report.onednn_convs() == {} and report.totals()["onednn_convs"] == 0
    assert "oneDNN convs: 0;" in report.summary()


def test_onednn_kind_reads_the_target_suffix():
    assert onednn_kind("layoutlab_onednn_conv_fwd") == "forward"
    assert onednn_kind("layoutlab_onednn_conv_dx") == "backward data"
    assert onednn_kind("layoutlab_onednn_conv_dw") == "backward weights"
    assert onednn_kind("layoutlab_onednn_reorder") == "reorder"
    assert onednn_kind("__cudnn$convForward") is None and onednn_kind(None) is None


@needs_onednn
def test_cost_counts_the_flops_of_onednn_convs():
    """XLA's cost analysis counts a custom call as -1 flop, so a step whose convs are oneDNN
    calls read almost no flops; ``cost_summary`` adds each call's conv work from its shapes.
    Reference: the conv's multiply-adds written out from its geometry (padding taps counted,
    as the per-conv table counts them): forward, input and weight gradient each do
    N*Ho*Wo*Cout*kh*kw*Cin of them."""
    from layoutlab.nn import conv_algos as ca
    from layoutlab.xla.compile import cost_summary
    from layoutlab.xla.custom_call_cost import XLA_FLOPS_PER_CUSTOM_CALL

    x, w = jnp.ones((2, 8, 8, 4)), jnp.ones((3, 3, 4, 8))

    def step(x, w):
        conv = functools.partial(ca.conv2d, strides=2, padding=1, kernel_layout="HWIO")
        y, vjp = jax.vjp(lambda a, b: conv(a, b, algorithm="onednn"), x, w)
        return vjp(y)

    compiled = jax.jit(step).lower(x, w).compile()
    raw = compiled.cost_analysis()
    raw = raw[0] if isinstance(raw, list) else raw
    assert raw["flops"] == 3 * XLA_FLOPS_PER_CUSTOM_CALL  # what XLA alone reports
    macs = 2 * 4 * 4 * 8 * 3 * 3 * 4
    cost = cost_summary(compiled)
    assert cost["onednn_flops"] == cost["flops"] == 3 * 2 * macs
    plain = cost_summary(jax.jit(lambda x: x * 2.0).lower(x).compile())
    assert plain["onednn_flops"] is None and plain["flops"] == x.size
