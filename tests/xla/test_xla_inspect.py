"""Model-level XLA inspection: ResNet-18 (all 20 convs, width 8, 32x32, CIFAR stem) in NHWC,
NCHW and mixed bf16 on CPU, checked against counts taken independently from the HLO text;
XLA's flop count of a one-conv model checked against the analytic count."""

import json
import math
import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from layoutlab import models, nn
from layoutlab.models import registry
from layoutlab.xla import (
    BackendError,
    ModelLayoutComparison,
    available_backends,
    hlo_report,
    inspect_model,
)
from layoutlab.xla.conv_rows import match_convs

# Every report here is compiled without LLVM optimizations: only the compiled HLO (and XLA's
# counts and buffer sizes from it) is read, and every LLVM level runs the same HLO passes
# (docs/development.md), in about half the compile time.
LEVEL_0 = {"xla_backend_optimization_level": 0}
# The real ResNet-18 structure, narrowed: stem conv + 8 basic blocks x 2 convs + 3 downsample
# 1x1 convs = 20 convolutions, each with its own kernel.
RESNET18 = dict(batch_size=2, image_size=32, stem="cifar", model_kwargs={"width": 8},
                flags=LEVEL_0)  # fmt: skip
RESNET18_CONVS = 1 + 8 * 2 + 3


@pytest.fixture(scope="module")
def nhwc():
    return inspect_model("resnet18", layout="NHWC", **RESNET18)


@pytest.fixture(scope="module")
def nchw():
    return inspect_model("resnet18", layout="NCHW", auto_layout=True, **RESNET18)


@pytest.fixture(scope="module")
def bf16():
    return inspect_model("resnet18", layout="NHWC", precision="mixed_bf16", **RESNET18)


# ---------------------------------------------------------------- independent text counts


def count_ops(text: str, opcode: str) -> int:
    return len(re.findall(rf" {opcode}\(", text))


_DEF_RE = re.compile(r"%?([\w.\-]+) = (\w+)\[([\d,]*)\]\S* (\w[\w\-]*)\(([^)]*)\)(.*)$")


def definitions(text: str) -> dict[str, tuple]:
    """name -> (dtype, dims, opcode, operand names, attributes) for every array-valued
    instruction; HLO names are unique within a module."""
    out = {}
    for line in text.splitlines():
        m = _DEF_RE.search(line.strip().removeprefix("ROOT "))
        if m:
            name, dtype, dims, opcode, operands, attrs = m.groups()
            dims = tuple(int(d) for d in dims.split(",") if d)
            ops = [o.strip().lstrip("%") for o in operands.split(",") if o.strip()]
            out[name] = (dtype, dims, opcode, ops, attrs)
    return out


def kernel_transposes_in_text(text: str) -> int:
    """Transposes OIHW -> HWIO ({2,3,1,0}) of an operand shaped [O, I, k, k]."""
    defs = definitions(text)
    count = 0
    for _dtype, _dims, opcode, ops, attrs in defs.values():
        if opcode != "transpose" or "dimensions={2,3,1,0}" not in attrs:
            continue
        src = defs.get(ops[0])
        if src and len(src[1]) == 4 and src[1][2] == src[1][3] and src[1][2] in (1, 3):
            count += 1
    return count


def converts_in_text(text: str, src: str, dst: str) -> int:
    defs = definitions(text)
    return sum(
        1
        for dtype, _, opcode, ops, _ in defs.values()
        if opcode == "convert" and dtype == dst and defs.get(ops[0], ("?",))[0] == src
    )


# ---------------------------------------------------------------- layouts and transposes


def test_nhwc_resnet18_has_no_transposes(nhwc):
    text = nhwc.report.hlo_text
    assert count_ops(text, "transpose") == 0  # plain-text check of the same claim
    t = nhwc.totals()
    assert t["transposes"] == t["kernel_transposes"] == t["memory_permutations"] == 0
    assert nhwc.num_conv_kernels == t["convolutions"] == RESNET18_CONVS
    assert nhwc.conv_layouts() == {"NHWC*HWIO->NHWC => NHWC*HWIO->NHWC": RESNET18_CONVS}


def test_nchw_resnet18_kernel_transposes_are_counted_right(nchw):
    text, pre = nchw.report.hlo_text, nchw.report.pre_hlo_text
    t = nchw.totals()
    # Three independent counts of the convs: the architecture (20), the conv ops written in
    # the pre-optimization text, and a regex count of OIHW->HWIO transposes of [O,I,k,k]
    # arrays in the optimized text. Each NCHW conv needs its OIHW kernel as HWIO on CPU.
    assert count_ops(pre, "convolution") == RESNET18_CONVS
    assert kernel_transposes_in_text(text) == RESNET18_CONVS
    assert t["kernel_transposes"] == RESNET18_CONVS
    # Plus one transpose of the NCHW input to NHWC; after that activations stay NHWC, and
    # the logits are 2-D, so no transpose comes back out.
    assert t["activation_transposes"] == 1
    assert t["transposes"] == count_ops(text, "transpose") == RESNET18_CONVS + 1
    assert t["memory_permutations"] == RESNET18_CONVS + 1
    # Each kernel transpose reads and writes the kernel once (f32: 4 bytes per element).
    kernel_bytes = sum(
        2 * 4 * math.prod(leaf.shape)
        for leaf in jax.tree.leaves(nchw_params_shapes())
        if len(leaf.shape) == 4
    )
    assert t["kernel_transpose_bytes"] == kernel_bytes


def nchw_params_shapes():
    """ResNet-18 NCHW conv kernels as shapes, built abstractly and independently of the
    inspection's own build."""
    model = nnx.eval_shape(lambda: models.create("resnet18", layout="NCHW", width=8, stem="cifar"))
    return nnx.state(model, nnx.Param)


def test_nchw_convs_run_physically_nhwc(nchw, nhwc):
    rows = nchw.conv_rows()
    assert len(rows) == RESNET18_CONVS
    assert {(r.logical, r.physical) for r in rows} == {("NCHW*OIHW->NCHW", "NHWC*HWIO->NHWC")}
    # Same convs in both layouts, only the axis order differs.
    assert [r.window for r in rows] == [r.window for r in nhwc.conv_rows()]
    # Layout changes no arithmetic.
    assert nchw.totals()["flops"] == nhwc.totals()["flops"]


def test_bf16_policy_shows_f32_converts(bf16):
    text = bf16.report.hlo_text
    t, conversions = bf16.totals(), bf16.report.hlo.conversions
    assert t["converts"] == count_ops(text, "convert") > 0
    # XLA's CPU convs run in f32: bf16 operands are converted up.
    assert conversions["bf16->f32"] == converts_in_text(text, "bf16", "f32") > 0
    assert conversions["f32->bf16"] == converts_in_text(text, "f32", "bf16") > 0
    rows = bf16.conv_rows()
    assert {r.dtypes_before for r in rows} == {"bf16*bf16->f32"}
    assert {r.dtypes_after for r in rows} == {"f32*f32->f32"}
    assert t["transposes"] == 0
    assert "bf16->f32" in bf16.summary()


# ---------------------------------------------------------------- Layout.AUTO


def test_auto_layout_reports_chosen_layouts(nchw):
    auto = nchw.auto_layouts()
    if "error" in auto:
        pytest.skip(f"Layout.AUTO refused here: {auto['error']}")
    params = jax.tree.leaves(nchw_params_shapes())
    assert auto["params"]["leaves"] == len(params)
    assert auto["images"]["leaves"] == 1
    assert auto["outputs"]["leaves"] == 1
    # AUTO can drop a kernel transpose only by storing that kernel in the conv's order.
    kernels_moved = sum(len(c["shape"]) == 4 for c in auto["params"]["changed"])
    assert auto["auto"]["kernel_transposes"] >= RESNET18_CONVS - kernels_moved
    for key, removed in auto["removed"].items():
        assert removed == auto["default"][key] - auto["auto"][key]
    assert "Layout.AUTO" in nchw.summary()


# ---------------------------------------------------------------- cost and memory


class OneConv(nnx.Module):
    def __init__(self, *, num_classes, layout, policy, rngs, in_channels=3, strides=1):
        self.policy = policy
        self.conv = nn.Conv(
            in_channels,
            num_classes,
            3,
            strides=strides,
            padding=1,
            use_bias=False,
            layout=layout,
            policy=policy,
            rngs=rngs,
        )

    def __call__(self, x):
        return self.policy.cast_to_output(self.conv(x))


@pytest.fixture
def one_conv():
    name = "one_conv_probe"
    registry.register(name, description="one 3x3 conv", default_input=(9, 9, 3))(OneConv)
    yield name
    registry.unregister(name)


def _valid_taps(size: int, k: int, stride: int, pad_lo: int) -> int:
    """Kernel taps that land on real input (not padding), summed over output positions."""
    out = (size + 2 * pad_lo - k) // stride + 1
    return sum(sum(1 for j in range(k) if 0 <= o * stride - pad_lo + j < size) for o in range(out))


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("h, stride", [(9, 1), (9, 2), (2, 1)])
def test_one_conv_flops_match_analytic_count(one_conv, layout, h, stride):
    # XLA counts 2 flops per kernel tap that reads real input (taps on padding are not
    # counted), so flops = 2*N*Cout*Cin*prod_d(valid taps along d); exact, as XLA's count is
    # an integer sum. Transposes of the NCHW variant add none.
    n, cin, cout = 2, 3, 5
    ins = inspect_model(
        one_conv,
        layout=layout,
        batch_size=n,
        image_size=h,
        num_classes=cout,
        model_kwargs={"strides": stride},
        flags=LEVEL_0,
    )
    taps = _valid_taps(h, 3, stride, 1)
    assert ins.totals()["flops"] == 2 * n * cout * cin * taps * taps
    assert taps < (((h + 2 - 3) // stride + 1) * 3)  # padding did remove taps
    # The conv keeps its written layout in the table even where XLA rewrote it (a 3x3
    # kernel over a 2x2 input: XLA swaps the operands).
    (row,) = ins.conv_rows()
    kernel = "HWIO" if layout == "NHWC" else "OIHW"
    assert row.logical == f"{layout}*{kernel}->{layout}" and row.physical is not None
    assert row.note is None or row.note.startswith("rewritten by XLA")


SWAP_BEFORE = """HloModule m
ENTRY e {
  x = f32[2,2,2,3]{3,2,1,0} parameter(0)
  w = f32[3,3,3,5]{3,2,1,0} parameter(1)
  ROOT c = f32[2,2,2,5]{3,2,1,0} convolution(x, w),
      window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
}
"""
# What XLA's CPU pipeline makes of it: the image becomes the (reversed) kernel.
SWAP_AFTER = """HloModule m
ENTRY e {
  w = f32[3,3,3,5]{3,2,1,0} parameter(0)
  x = f32[2,2,2,3]{3,2,1,0} parameter(1)
  ROOT c = f32[2,2,2,5]{3,2,1,0} convolution(w, x),
      window={size=2x2 rhs_reversal=1x1}, dim_labels=01fb_o01i->f01b
}
"""


def test_match_convs_pairs_rewritten_and_unmatched_convs():
    before, after = hlo_report(SWAP_BEFORE), hlo_report(SWAP_AFTER)
    (row,) = match_convs(before, after)
    assert (row.logical, row.physical) == ("NHWC*HWIO->NHWC", "HWCN*OHWI->CHWN")
    assert row.note.startswith("rewritten by XLA") and row.name == "c"
    # A conv XLA removed keeps its row with no physical layout; one it made has no logical.
    (gone,) = match_convs(
        before, hlo_report("HloModule m\nENTRY e {\n  ROOT p = f32[2] parameter(0)\n}\n")
    )
    assert gone.logical == "NHWC*HWIO->NHWC" and gone.physical is None
    (made,) = match_convs(None, after)
    assert made.logical is None and made.note == "made by XLA"


def _nbytes(tree) -> int:
    total = 0
    for leaf in jax.tree.leaves(tree):
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.eval_shape(jax.random.key_data, leaf)
        total += math.prod(leaf.shape) * jnp.dtype(leaf.dtype).itemsize
    return total


def test_train_mode_compiles_and_reports_memory():
    tiny = models.spec("small_cnn").tiny
    ins = inspect_model(
        "small_cnn",
        precision="mixed_fp16",
        mode="train",
        batch_size=4,
        model_kwargs=tiny,
        flags=LEVEL_0,
    )
    assert ins.loss_scale == "DynamicLossScale"  # float16 compute gets a dynamic loss scale
    t = ins.totals()
    # Arguments: the train state, the f32 images and the int32 labels, byte for byte, less
    # the skip wrapper's 1-byte ``last_finite`` flag: the step writes it but never reads it,
    # and jit drops unused arguments.
    state = ins.report.lowered.args_info[0][0]
    state_bytes = _nbytes(jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state))
    images, labels = math.prod(ins.input_shape) * 4, 4 * 4
    assert t["argument_bytes"] == state_bytes - 1 + images + labels
    # The state is donated, so its buffers are reused for the new state.
    assert 0 < t["alias_bytes"] <= state_bytes
    assert t["temp_bytes"] >= 0 and t["peak_bytes"] > 0
    # Backward convs (input and kernel gradients) join the 3 forward ones.
    assert t["convolutions"] > ins.num_conv_kernels == 3
    assert "memory: arguments" in ins.summary()


# ---------------------------------------------------------------- reports


def test_json_and_summary(nchw, nhwc):
    d = json.loads(nchw.to_json())
    assert d["layout"] == "NCHW" and d["kernel_layout"] == "OIHW" and d["mode"] == "infer"
    assert d["totals"]["kernel_transposes"] == RESNET18_CONVS
    assert len(d["convolutions"]) == RESNET18_CONVS
    assert d["convolutions"][0]["logical"] == "NCHW*OIHW->NCHW"
    assert d["backend"] == "cpu" and d["versions"]["jax"] == jax.__version__
    assert d["memory"]["argument_size"] > 0 and d["compile_seconds"] > 0
    assert "compile" in nchw.to_dict(include_compile=True)
    assert nchw.file_stem() == "resnet18_NCHW_fp32_infer_cpu"
    text = nchw.summary()
    assert "NCHW*OIHW->NCHW => NHWC*HWIO->NHWC: 20" in text
    table = ModelLayoutComparison({"NHWC": nhwc, "NCHW": nchw}).table()
    kernel_row = next(line for line in table.splitlines() if line.startswith("kernel_transposes"))
    assert kernel_row.split()[1:] == ["0", str(RESNET18_CONVS)]


def test_dump_hlo(nhwc, tmp_path):
    paths = nhwc.dump_hlo(tmp_path)
    assert len(paths) == 2
    before, after = sorted(paths, key=lambda p: "after" in p)
    with open(before) as f:
        assert f.read() == nhwc.report.pre_hlo_text
    with open(after) as f:
        assert f.read() == nhwc.report.hlo_text


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mode": "eval"}, "Unknown mode 'eval'"),
        ({"batch_size": 0}, "batch_size must be a positive int"),
        ({"image_size": -1}, "image_size must be"),
        ({"layout": "NCWH"}, "Unknown layout"),
        ({"precision": "fp8"}, "Unknown precision policy"),
        ({"model_kwargs": {"depth": 3}}, "unknown options"),
        ({"backend": "tpu9"}, "Available backends: .*cpu"),
    ],
)
def test_bad_input_is_a_clear_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        inspect_model("small_cnn", **kwargs)


def test_unknown_model():
    # (A segmentation model's training step compiles: tests/train/test_segmentation_training.py.)
    with pytest.raises(ValueError, match="Unknown model 'resnet19'.*resnet18"):
        inspect_model("resnet19")


def test_gpu_without_gpu_is_a_clear_error():
    if "gpu" in available_backends():
        pytest.skip("a GPU is present")
    with pytest.raises(BackendError, match="No GPU .*Available backends: cpu"):
        inspect_model("small_cnn", backend="gpu")


@pytest.mark.gpu
def test_gpu_reports_conv_layouts():
    ins = inspect_model("resnet18", layout="NCHW", backend="gpu", **RESNET18)
    rows = ins.conv_rows()
    assert ins.report.platform == "gpu"
    assert len(rows) >= RESNET18_CONVS
    assert all(r.logical and r.physical and "?" not in r.physical for r in rows)


@pytest.mark.gpu
def test_gpu_runs_mixed_precision_convs_in_half():
    # XLA:GPU widened a bf16 x bf16 -> f32 conv to f32 x f32 -> f32 (all of ResNet-50's,
    # on an H200); nn's convs are written bf16 -> bf16 there, which cuDNN runs as written.
    # At the default precision a user gets (conftest asks for "highest" on a GPU).
    with jax.default_matmul_precision("default"):
        ins = inspect_model("resnet18", backend="gpu", precision="mixed_bf16", mode="train",
                            **RESNET18)  # fmt: skip
    rows = ins.conv_rows()
    assert len(rows) >= RESNET18_CONVS
    assert {r.dtypes_after for r in rows} == {"bf16*bf16->bf16"}, [r.dtypes_after for r in rows]
