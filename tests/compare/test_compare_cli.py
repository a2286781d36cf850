"""``layoutlab compare``: exit codes 0 (pass), 1 (tolerance exceeded), 2 (bad input)."""

import argparse
import json

import pytest

from layoutlab.compare import command


def _run(*argv):
    parser = argparse.ArgumentParser(prog="layoutlab")
    command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["compare", *argv])
    return args.func(args)


TINY = ("--model", "small_cnn", "--tiny", "--batch-size", "2")


def test_pass_exits_0_and_writes_json(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert _run(*TINY, "--against", "layout", "--layerwise", "--json-file", str(out)) == 0
    printed = capsys.readouterr().out
    assert "compare against layout: PASSED" in printed and "features.0.0" in printed
    data = json.loads(out.read_text())
    assert data["passed"] is True and data["against"] == "layout"
    assert data["settings"]["model"] == "small_cnn" and data["settings"]["input_shape"] == [
        2, 8, 8, 1
    ]  # fmt: skip
    assert data["layers"]["rows"][0]["path"] == "features.0.0"


def test_exceeded_tolerance_exits_1(capsys):
    # Exact tolerance: bfloat16 compute cannot match float32 bit for bit.
    code = _run(*TINY, "--against", "fp32", "--precision", "mixed_bf16", "--rtol", "0",
                "--atol", "0")  # fmt: skip
    assert code == 1
    assert "FAILED" in capsys.readouterr().out


def test_stem_flag_as_in_bench_and_inspect(tmp_path):
    out = tmp_path / "report.json"
    argv = ("--model", "resnet18", "--stem", "cifar", "--tiny", "--batch-size", "1")
    # Against float64 NumPy: one XLA compile (the model under test) instead of two.
    assert _run(*argv, "--image-size", "16", "--against", "numpy", "--json-file", str(out)) == 0
    settings = json.loads(out.read_text())["settings"]
    assert settings["model_kwargs"]["stem"] == "cifar" and settings["input_shape"] == [1, 16, 16, 3]


def test_numpy_reference_passes_with_defaults():
    assert _run(*TINY, "--against", "numpy", "--layout", "NCHW", "--mode", "train") == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--against", "layout", "--rtol", "1e-3"), "--rtol was given without --atol"),
        (("--against", "layout", "--atol", "1e-3"), "--atol was given without --rtol"),
        (("--against", "layout", "--rtol", "-1", "--atol", "0"), "--rtol must be"),
        (("--against", "fp32"), "already computes in float32"),
        (("--against", "numpy", "--grads"), "no gradients"),
        (("--against", "layout", "--precision", "fp8"), "Unknown precision policy"),
        (("--against", "layout", "--layout", "NHCW"), "Unknown layout"),
        (("--against", "layout", "--batch-size", "0"), "--batch-size must be >= 1"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, message, capsys):
    assert _run("--model", "small_cnn", "--tiny", *argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_unknown_model_exits_2(capsys):
    assert _run("--model", "resnet7", "--against", "layout") == 2
    assert "Unknown model 'resnet7'" in capsys.readouterr().err


def test_missing_weights_file_exits_2(tmp_path, capsys):
    pytest.importorskip("torch")
    code = _run(*TINY, "--against", "layout", "--torch-weights", str(tmp_path / "no.pth"))
    assert code == 2
    assert "No PyTorch weights file" in capsys.readouterr().err


def test_against_torch_with_weights_file(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from layoutlab.compare.torch_mirrors import build_torch_mirror

    torch.manual_seed(0)
    mirror = build_torch_mirror("small_cnn", num_classes=10, width=4, hidden=16)
    path = tmp_path / "small_cnn.pth"
    torch.save(mirror.state_dict(), path)
    out = tmp_path / "torch.json"
    code = _run(*TINY, "--against", "torch", "--torch-weights", str(path), "--layerwise",
                "--grads", "--mode", "train", "--json-file", str(out))  # fmt: skip
    assert code == 0, capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["settings"]["torch_weights"] == str(path)
    assert data["settings"]["torch_float32_matmul_precision"] == "highest"
    assert data["grads"]["passed"] is True
    # Weights that do not fit the architecture are bad input, not a numerics failure.
    wide = build_torch_mirror("small_cnn", num_classes=10, width=6, hidden=16)
    torch.save(wide.state_dict(), path)
    assert _run(*TINY, "--against", "torch", "--torch-weights", str(path)) == 2
    assert "shape" in capsys.readouterr().err
