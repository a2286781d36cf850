"""The fast defaults outside train and bench: ``models.create`` and ``layoutlab compare``.

On CPU a model from ``models.create`` stores HWIO kernels and, if channels-first, computes
channels-last inside; ``compare`` checks the model as train and bench run it (those storages,
the shipped conv table's plan, the XLA:CPU options) against an independent reference.
"""

import argparse
import json

import jax
import numpy as np
import pytest
from flax import nnx

from layoutlab import models, nn
from layoutlab.compare import command
from layoutlab.compare import references as refs
from layoutlab.compare.torch_weights import load_torch_state_dict, to_torch_state_dict
from layoutlab.fast_defaults import cpu_kind, fast_compile_options
from layoutlab.layout import Layout
from layoutlab.nn.conv_config import convs

on_cpu = pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU defaults")


def _run(*argv):
    parser = argparse.ArgumentParser(prog="layoutlab")
    command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["compare", *argv])
    return args.func(args)


def _create(**kw):
    return models.create("resnet18", layout="NCHW", rngs=nnx.Rngs(3), stem="cifar", width=4, **kw)


def _assert_same_params(model, other, *, oihw_from_hwio=False):
    """Every parameter of ``model`` equals ``other``'s exactly; with ``oihw_from_hwio``,
    ``model``'s conv kernels are HWIO and ``other``'s the same values in OIHW."""
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    for (path, a), (_, b) in zip(flat, nnx.to_flat_state(nnx.state(other, nnx.Param)), strict=True):
        a, b = np.asarray(a.get_value()), np.asarray(b.get_value())
        if oihw_from_hwio and a.ndim == 4:
            a = a.transpose(3, 2, 0, 1)
        np.testing.assert_array_equal(a, b, err_msg=str(path))


@pytest.fixture(scope="module")
def fast_and_plain():
    """The default model and its plain twin (same seed); the tests below only read them."""
    return _create(), _create(kernel_storage="layout", activation_storage="layout")


@on_cpu
def test_models_create_stores_hwio_and_computes_channels_last_inside_by_default(fast_and_plain):
    fast, plain = fast_and_plain
    assert fast.compute_layout == Layout.NHWC and fast.conv1.kernel_spec == "HWIO"
    assert plain.compute_layout == Layout.NCHW and plain.conv1.kernel_spec == "OIHW"
    _assert_same_params(fast, plain, oihw_from_hwio=True)  # the same seed, the same weights
    with pytest.raises(ValueError, match="Unknown activation_storage 'nhwc'"):
        _create(activation_storage="nhwc")
    with pytest.raises(ValueError, match="Unknown kernel_storage 'oihw'"):
        _create(kernel_storage="oihw")


@on_cpu
def test_torch_weights_and_convert_layout_stay_exact_under_the_defaults(fast_and_plain):
    fast, plain = fast_and_plain
    exported = to_torch_state_dict(fast)
    for key, value in to_torch_state_dict(plain).items():
        np.testing.assert_array_equal(exported[key], value, err_msg=key)  # PyTorch's order
    other = models.create("resnet18", layout="NCHW", rngs=nnx.Rngs(9), stem="cifar", width=4)
    _assert_same_params(load_torch_state_dict(other, exported), fast)
    _assert_same_params(nn.convert_layout(fast, "NHWC"), nn.convert_layout(plain, "NHWC"))


# The candidate of a CLI comparison runs Winograd only if the table has a rule for its
# shapes and batch: 3x3 stride-1 convs with 128+ input channels, in inference from batch 32
# at 8x8 and larger on AVX2 and at 7x7 to 28x28 on AVX-512 from batch 33, past its oneDNN
# rule (a ResNet-18 of width 32 at 32x32 has them in layer3; on AVX-512 4x4 inputs wait for
# batch 128). No rule applies on other CPUs, where a small batch keeps the test quick.
_BATCH_AND_SIZE = {"avx2": ("32", "32"), "avx512": ("33", "32")}.get(cpu_kind(), ("2", "16"))
WINOGRAD_SHAPES = ("--model", "resnet18", "--model-arg", 'stem="cifar"', "--model-arg",
                   "width=32", "--image-size", _BATCH_AND_SIZE[1],
                   "--batch-size", _BATCH_AND_SIZE[0])  # fmt: skip


@on_cpu
@pytest.mark.parametrize(
    ("argv", "first_layer"),
    [
        (WINOGRAD_SHAPES, [int(_BATCH_AND_SIZE[0]), 32, *[int(_BATCH_AND_SIZE[1])] * 2]),
        (("--model", "unet", "--tiny", "--batch-size", "2"), [2, 4, 32, 32]),
    ],
    ids=["resnet18-winograd", "unet"],
)
def test_compare_checks_the_defaults_layer_by_layer_against_float64_numpy(
    argv, first_layer, tmp_path
):
    out = tmp_path / "report.json"
    code = _run(*argv, "--layout", "NCHW", "--against", "numpy", "--layerwise",
                "--json-file", str(out))  # fmt: skip
    report = json.loads(out.read_text())
    # The default tolerance (3e-4 x each layer's largest value, refs.FLOOR): the shipped
    # plan's Winograd convs put full-size ResNet-18's worst layer at 1.6e-5 of it against
    # 4.3e-6 with XLA's conv (benchmarks/results/compare_defaults_resnet18_cifar_cpu.md).
    assert code == 0 and report["passed"] and report["layers"]["passed"]
    s = report["settings"]
    assert (s["conv_algo"], s["kernel_storage"], s["activation_storage"]) == (
        "auto", "HWIO", "channels_last")  # fmt: skip
    assert s["candidate_xla_options"] == fast_compile_options("infer")
    if argv is WINOGRAD_SHAPES and cpu_kind() in ("avx2", "avx512"):
        assert any(name.startswith("winograd4") for name in s["conv_algorithms"])
    # The layers computed NHWC inside and were compared in the model's layout, NCHW.
    assert report["layers"]["rows"][0]["shape"] == first_layer


def test_each_compare_default_turns_off(tmp_path):
    out = tmp_path / "plain.json"
    code = _run("--model", "small_cnn", "--tiny", "--batch-size", "2", "--layout", "NCHW",
                "--against", "numpy", "--conv-algo", "xla", "--kernel-storage", "layout",
                "--activation-storage", "layout", "--no-cpu-fast",
                "--json-file", str(out))  # fmt: skip
    assert code == 0
    s = json.loads(out.read_text())["settings"]
    assert s["conv_algorithms"] == {"xla": 3} and s["kernel_storage"] == "OIHW"
    assert s["activation_storage"] == "layout" and "candidate_xla_options" not in s


def test_a_jax_reference_runs_xlas_own_convs(monkeypatch):
    seen = []
    real = refs.layer_outputs

    def spy(model, x, **kw):
        seen.append(sorted({c.algorithm for _, c in convs(model)}))
        return real(model, x, **kw)

    monkeypatch.setattr(refs, "layer_outputs", spy)
    model = models.create("small_cnn", layout="NCHW", rngs=nnx.Rngs(0), width=4, hidden=16)
    model = nn.configure(model, nn.ConvSettings.named("im2col"))
    x = np.random.default_rng(0).standard_normal((2, 1, 8, 8)).astype(np.float32)
    assert refs.against_layout(model, x).passed
    assert seen == [["xla"], ["im2col"]]  # reference, then candidate


def test_the_report_counts_what_ran_after_a_refusal(tmp_path):
    # s2d takes stride-2 convs only: small_cnn's three stride-1 convs run XLA's conv.
    out = tmp_path / "s2d.json"
    code = _run("--model", "small_cnn", "--tiny", "--batch-size", "2", "--against", "numpy",
                "--conv-algo", "s2d", "--json-file", str(out))  # fmt: skip
    assert code == 0
    s = json.loads(out.read_text())["settings"]
    assert s["conv_algo"] == "s2d" and s["conv_algorithms"] == {"xla": 3}


def test_bad_conv_settings_exit_2_with_one_line(capsys):
    assert _run("--model", "small_cnn", "--tiny", "--against", "numpy", "--conv-algo", "fft") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Unknown conv algorithm 'fft'") and err.count("\n") == 1
    with pytest.raises(SystemExit) as exc:  # argparse's invalid choice, also exit 2
        _run("--model", "small_cnn", "--against", "numpy", "--kernel-storage", "oihw")
    assert exc.value.code == 2 and "invalid choice: 'oihw'" in capsys.readouterr().err
