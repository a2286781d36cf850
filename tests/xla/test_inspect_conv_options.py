"""``inspect_model`` / ``layoutlab inspect`` with conv settings: kernels stored channels-last
remove the per-call kernel transposes of an NCHW model, im2col removes the convolutions,
"auto" runs the conv plan given and reports the convs it lacks, and bad names are one-line
errors."""

import argparse
import json

import jax
import pytest
from flax import nnx

from layoutlab import models
from layoutlab.nn.conv_algos import ConvPlan
from layoutlab.nn.conv_config import conv_specs
from layoutlab.xla.command import register
from layoutlab.xla.inspect import inspect_model

# Compiled without LLVM optimizations: only the compiled HLO is read, and every LLVM level
# runs the same HLO passes on it (docs/development.md), in about half the compile time.
LEVEL_0 = {"xla_backend_optimization_level": 0}
# Tiny ResNet-18: 20 convs (stem, 8 blocks x 2, 3 downsample 1x1), 16x16 images.
RESNET = dict(
    batch_size=2, image_size=16, model_kwargs=dict(models.spec("resnet18").tiny), flags=LEVEL_0
)
RESNET_CONVS = 20
# small_cnn tiny: 3 convs on 1x8x8 images, the cheapest model to compile.
SMALL = dict(batch_size=2, model_kwargs=dict(models.spec("small_cnn").tiny), flags=LEVEL_0)
SMALL_CLI = ["--model", "small_cnn", "--tiny", "--batch-size", "2", "--layout", "NCHW"]


def run_cli(argv, capsys):
    parser = argparse.ArgumentParser(prog="layoutlab")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["inspect", *argv])
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_channels_last_kernels_remove_per_call_kernel_transposes():
    default = inspect_model("resnet18", layout="NCHW", **RESNET)
    hwio = inspect_model("resnet18", layout="NCHW", kernel_storage="channels_last", **RESNET)
    d, c = default.totals(), hwio.totals()
    # XLA:CPU runs every conv as NHWC*HWIO, so with OIHW storage each of the 20 kernels is
    # transposed on every call; the one other transpose is the image, NCHW -> NHWC.
    assert d["convolutions"] == c["convolutions"] == RESNET_CONVS
    assert d["kernel_transposes"] == RESNET_CONVS and d["transposes"] == RESNET_CONVS + 1
    # HWIO storage is what the convs read: only the image transpose is left.
    assert c["kernel_transposes"] == 0 and c["kernel_transpose_bytes"] == 0
    assert c["transposes"] == c["memory_permutations"] == 1
    # memory_permutations does not depend on kernel shapes: an independent check of the drop.
    assert d["memory_permutations"] - c["memory_permutations"] == RESNET_CONVS

    assert hwio.kernel_layout == "HWIO" and default.kernel_layout == "OIHW"
    assert all(shape[:2] in ((3, 3), (1, 1)) for shape in hwio.kernel_shapes)
    data = hwio.to_dict()
    assert (data["conv_algorithm"], data["kernel_storage"]) == ("xla", "channels_last")
    assert data["missing_choices"] is None
    summary = hwio.summary()
    assert "conv algorithm xla; kernel storage channels_last" in summary
    assert "NCHW*HWIO->NCHW => NHWC*HWIO->NHWC" in summary
    assert hwio.file_stem() == "resnet18_NCHW_fp32_infer_cpu_channels_last"
    assert default.file_stem() == "resnet18_NCHW_fp32_infer_cpu"


def test_im2col_leaves_no_convolutions():
    ins = inspect_model("small_cnn", layout="NCHW", conv_algorithm="im2col", **SMALL)
    t = ins.totals()
    assert t["convolutions"] == 0
    assert ins.hlo_before.totals()["convolutions"] == 0  # never written, not optimized away
    assert ins.hlo.totals()["dots"] >= 3  # each conv became a matmul
    assert ins.to_dict()["conv_algorithm"] == "im2col"
    assert "conv algorithm im2col; kernel storage layout" in ins.summary()


def test_mixed_bf16_im2col_runs_bf16_gemms_where_native_convs_run_in_f32():
    # XLA:CPU has no bf16 convolution: it converts the operands and convolves in f32. The
    # im2col algorithm hands the same work to dots, which take the bf16 operands directly
    # and accumulate in f32 (preferred_element_type).
    native = inspect_model("small_cnn", layout="NHWC", precision="mixed_bf16", **SMALL)
    gemm = inspect_model(
        "small_cnn", layout="NHWC", precision="mixed_bf16", conv_algorithm="im2col", **SMALL
    )
    assert native.hlo.operand_dtypes()["convolutions"] == {"f32*f32->f32": 3}
    assert gemm.hlo.operand_dtypes()["convolutions"] == {}
    assert gemm.hlo.operand_dtypes()["dots"].get("bf16*bf16->f32", 0) >= 3
    assert "operand dtypes:" in gemm.hlo.summary()


def _first_conv_plan():
    # Abstract: eager weight init would compile many small ops.
    kwargs = SMALL["model_kwargs"]
    # Computing in NCHW, as inspect_model's layouts do unless told otherwise.
    model = nnx.eval_shape(
        lambda: models.create("small_cnn", layout="NCHW", activation_storage="layout", **kwargs)
    )
    specs = conv_specs(model, jax.ShapeDtypeStruct((2, 1, 8, 8), "float32"))
    assert len(specs) == 3
    path, spec = next(iter(specs.items()))
    return ConvPlan({path: ("im2col", spec.key())}), path


def test_auto_runs_the_plan_given_and_reports_missing_convs():
    plan, path = _first_conv_plan()
    ins = inspect_model("small_cnn", layout="NCHW", conv_algorithm="auto", conv_plan=plan, **SMALL)
    assert (ins.missing_choices, ins.conv_shapes) == (2, 3)
    assert ins.totals()["convolutions"] == 2  # the first conv ran im2col
    assert "auto: 2 of 3 convs have no conv plan entry" in ins.summary()
    assert f"plan: {path} -> im2col" in ins.summary()
    assert ins.to_dict()["conv_plan"] == {path: "im2col"}
    # No plan: the shipped table's (nn.conv_algos.default_plan), one entry per conv.
    bare = inspect_model("small_cnn", layout="NCHW", conv_algorithm="auto", **SMALL)
    assert bare.missing_choices == 0 and len(bare.to_dict()["conv_plan"]) == 3


def test_cli_conv_plan_file_and_bad_plans(tmp_path, capsys):
    plan, path = _first_conv_plan()
    good = plan.save(tmp_path / "plan.json")
    # The plan's shapes are those of convs computing in NCHW (a plan entry is keyed by its
    # conv's shape, layout included), so the layers must compute there.
    nchw = ["--activation-storage", "layout"]
    code, out, err = run_cli(
        [*SMALL_CLI, *nchw, "--conv-algo", "auto", "--conv-plan", str(good)], capsys
    )
    assert code == 0, err
    assert f"plan: {path} -> im2col" in out and "auto: 2 of 3 convs" in out
    bad = tmp_path / "bad.json"
    for text, message in [
        ("{not json", "is not valid JSON"),
        ('{"convs": {"x": {"algorithm": "fft", "spec_key": "k"}}}', "Unknown conv algorithm"),
        ('{"convs": {"nope": {"algorithm": "im2col", "spec_key": "k"}}}', "another model"),
    ]:
        bad.write_text(text)
        argv = [*SMALL_CLI, "--conv-algo", "auto", "--conv-plan", str(bad)]
        code, out, err = run_cli(argv, capsys)
        assert code == 2 and err.startswith("error: ") and message in err, err
        assert err.count("\n") == 1


def test_cli_flags_are_used_and_shown(tmp_path, capsys):
    path = tmp_path / "r.json"
    argv = [*SMALL_CLI, "--kernel-storage", "channels_last", "--conv-algo", "xla"]
    code, out, err = run_cli([*argv, "--json-file", str(path)], capsys)
    assert code == 0, err
    assert "conv algorithm xla; kernel storage channels_last" in out
    assert "(kernels HWIO)" in out
    data = json.loads(path.read_text())
    assert data["kernel_storage"] == "channels_last"
    # small_cnn's 3 kernels, each transposed per call with OIHW storage (test_xla_cli), none here
    assert data["totals"]["kernel_transposes"] == 0


def test_bad_conv_options_fail_before_building():
    with pytest.raises(ValueError, match="Unknown kernel_storage"):
        inspect_model("resnet18", kernel_storage="nchw", **RESNET)
