"""HLO text parser and report on hand-written snippets in the formats XLA prints."""

import json

import pytest

from layoutlab.xla.hlo import diff, hlo_report
from layoutlab.xla.hlo_extract import decode_dim_labels, parse_window
from layoutlab.xla.hlo_parse import ArrayShape, HloParseError, parse_hlo, parse_shape

# A cuDNN conv as the GPU compiler leaves it: tuple result, backend_config JSON spread over
# several lines, NCHW logical dims stored NHWC ({1,3,2,0}), a /*index=*/ comment.
CUDNN = """
HloModule jit_f, entry_computation_layout={(f16[8,4,16,16]{1,3,2,0})->f16[8,32,16,16]{1,3,2,0}}

ENTRY %main (p0: f16[8,4,16,16], p1: f16[32,4,3,3]) -> f16[8,32,16,16] {
  %p0 = f16[8,4,16,16]{1,3,2,0} parameter(0)
  %p1 = f16[32,4,3,3]{1,3,2,0} parameter(1)
  %cudnn-conv.1 = (f16[8,32,16,16]{1,3,2,0}, /*index=1*/u8[0]{0})
      custom-call(%p0, %p1), window={size=3x3 stride=2x2 pad=1_1x1_1},
      dim_labels=bf01_oi01->bf01, custom_call_target="__cudnn$convForward",
      backend_config={
        "cudnn_conv_backend_config":{
          "activation_mode":"kNone",
          "conv_result_scale":1,
          "algorithm":{"algo_id":"28","tuning_knobs":{"3":"0","2":"3"}}
        }
      }
  ROOT %get-tuple-element = f16[8,32,16,16]{1,3,2,0} get-tuple-element(%cudnn-conv.1), index=0
}
"""

# Fusions (one nested in another), a to_apply reducer, a while loop, metadata strings holding
# braces/commas/parens and an escaped quote, tiled layouts, pred[] and old-style operands
# printed with their shapes.
MIXED = r"""
HloModule m, is_scheduled=true

FileNames
1 "/tmp/a{b}.py"

StackFrames
1 {file_location_id=1 parent_frame_id=1}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add.1 = f32[] add(f32[] %a, f32[] %b)
}

%inner (q: f32[16,8]) -> f32[8,16] {
  %q = f32[16,8]{1,0} parameter(0)
  ROOT %t.in = f32[8,16]{1,0} transpose(f32[16,8]{1,0} %q), dimensions={1,0}
}

%fused (p: bf16[16,8]) -> f32[8,16] {
  %p = bf16[16,8]{1,0:T(8,128)(2,1)} parameter(0)
  %cv = f32[16,8]{1,0} convert(%p), metadata={op_name="a{,}(\"x\")" source_file="f.py"}
  ROOT %nested = f32[8,16]{1,0} fusion(%cv), kind=kLoop, calls=%inner
}

%body (s: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
  %s = (s32[], f32[8,16]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %v = f32[8,16]{1,0} get-tuple-element(%s), index=1
  %c = f32[8,16]{0,1} copy(%v)
  %back = f32[8,16]{1,0} copy(%c)
  ROOT %tup = (s32[], f32[8,16]{1,0}) tuple(%i, %back)
}

%cond (s.1: (s32[], f32[8,16])) -> pred[] {
  %s.1 = (s32[], f32[8,16]{1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%s.1), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i.1, %n), direction=LT
}

ENTRY %main (x: bf16[16,8]) -> f32[] {
  %x = bf16[16,8]{1,0:T(8,128)(2,1)} parameter(0)
  %f = f32[8,16]{1,0} fusion(%x), kind=kInput, calls=%fused, metadata={op_name="}{"}
  %zero = s32[] constant(0)
  %init = (s32[], f32[8,16]{1,0}) tuple(%zero, %f)
  %w = (s32[], f32[8,16]{1,0}) while(%init), condition=%cond, body=%body
  %r = f32[8,16]{1,0} get-tuple-element(%w), index=1
  %z = f32[] constant(0)
  ROOT %sum = f32[] reduce(%r, %z), dimensions={0,1}, to_apply=%add
}
"""


def test_parse_shape_variants():
    s = parse_shape("bf16[2,3,4]{1,2,0:T(8,128)(2,1)}")
    assert s == ArrayShape("bf16", (2, 3, 4), (1, 2, 0), "T(8,128)(2,1)")
    assert s.nbytes == 2 * 3 * 4 * 2
    assert s.major_to_minor == (0, 2, 1)
    assert parse_shape("pred[]").nbytes == 1
    assert parse_shape("f32[<=5,2]{1,0}").dims == (5, 2)
    tup = parse_shape("(f32[2]{0}, (s32[], u8[0]{0}))")
    assert isinstance(tup, tuple) and tup[1][1] == ArrayShape("u8", (0,), (0,))
    assert parse_shape("s4[3]{0}").nbytes == 2  # packed: 12 bits round up to 2 bytes


def test_cudnn_custom_call_is_a_convolution_with_physical_layouts():
    report = hlo_report(CUDNN)
    (conv,) = report.convolutions
    assert conv.target == "__cudnn$convForward"
    assert conv.logical == {"input": "NCHW", "kernel": "OIHW", "output": "NCHW"}
    # {1,3,2,0} minor-to-major = N,H,W,C major-to-minor for NCHW-labelled dims.
    assert conv.physical == {"input": "NHWC", "kernel": "OHWI", "output": "NHWC"}
    assert conv.out == ArrayShape("f16", (8, 32, 16, 16), (1, 3, 2, 0))
    assert conv.window.stride == (2, 2) and conv.window.pad == ((1, 1), (1, 1))
    assert [c.target for c in report.custom_calls] == ["__cudnn$convForward"]
    json.dumps(report.to_dict())


def test_mixed_module_kinds_nesting_and_data_movement():
    module = parse_hlo(MIXED)
    assert module.name == "m"
    assert set(module.computations) == {"add", "inner", "fused", "body", "cond", "main"}
    report = hlo_report(module)
    kinds = report.computation_kinds
    assert kinds == {
        "main": "entry",
        "fused": "fusion",
        "inner": "fusion",
        "body": "control",
        "cond": "control",
        "add": "applied",
    }
    (t,) = report.transposes
    assert (t.computation, t.fusion, t.nested) == ("inner", "nested", True)
    assert t.bytes_in == t.bytes_out == 8 * 16 * 4 and t.bytes_moved == 2 * 8 * 16 * 4
    assert t.permutes_memory is True
    (cv,) = report.converts
    assert cv.conversion == "bf16->f32" and cv.fusion == "f"
    assert cv.bytes_moved == 16 * 8 * 2 + 16 * 8 * 4
    assert [c.permutes_memory for c in report.copies] == [True, True]
    assert report.fusion_kinds == {"kInput": 1, "kLoop": 1}
    # The reducer's add is a scalar lambda, counted nowhere; the while body is top level.
    assert "add" not in report.op_counts and report.op_counts["copy"] == 2
    assert report.fused_op_counts["transpose"] == 1
    assert report.totals()["transposes_nested"] == 1


def test_layout_only_transpose_does_not_permute_memory():
    text = """
HloModule t
ENTRY e {
  p = f32[2,8,8,4]{3,2,1,0} parameter(0)
  t = f32[2,4,8,8]{1,3,2,0} transpose(p), dimensions={0,3,1,2}
  ROOT c = f32[2,4,8,8]{3,2,1,0} copy(t)
}
"""
    report = hlo_report(text)
    assert [op.permutes_memory for op in report.transposes] == [False]
    assert [op.permutes_memory for op in report.copies] == [True]
    assert len(report.memory_permutations) == 1


def test_dot_and_diff():
    before = hlo_report("HloModule a\nENTRY e {\n  ROOT p = f32[4,8]{1,0} parameter(0)\n}\n")
    after = hlo_report(
        """
HloModule b
ENTRY e {
  a = f32[4,8]{1,0} parameter(0)
  b = f32[8,16]{0,1} parameter(1)
  ROOT d = f32[4,16]{1,0} dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""
    )
    (dot,) = after.dots
    assert dot.lhs.dims == (4, 8) and dot.rhs.minor_to_major == (0, 1)
    assert dot.lhs_contracting_dims == (1,) and dot.rhs_batch_dims == ()
    d = diff(before, after)
    assert d["dots"] == (0, 1, 1) and d["op:parameter"] == (1, 2, 1)


def test_dim_labels_and_window_decoding():
    assert decode_dim_labels("b01f_01io->b01f") == {
        "input": "NHWC",
        "kernel": "HWIO",
        "output": "NHWC",
    }
    assert decode_dim_labels("b0f_0io->b0f")["input"] == "NWC"
    assert decode_dim_labels("bf012_oi012->bf012")["kernel"] == "OIDHW"
    w = parse_window("{size=3x3 stride=2x1 pad=-1_2x0_0 rhs_dilate=2x2}")
    assert w.pad == ((-1, 2), (0, 0)) and w.lhs_dilate == (1, 1) and w.rhs_dilate == (2, 2)
    with pytest.raises(ValueError, match="dim_labels"):
        decode_dim_labels("nonsense")


@pytest.mark.parametrize(
    "text, match",
    [
        ("", "empty"),
        ("module @jit_f { func.func public @main() }", "no computations"),
        ("HloModule x\nENTRY e {\n  ROOT p = f32[2] parameter(0)\n", "not closed"),
    ],
)
def test_parser_errors_are_clear(text, match):
    with pytest.raises(HloParseError, match=match):
        parse_hlo(text)
