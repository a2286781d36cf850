"""``layoutlab inspect``: tables, JSON, HLO dumps, AUTO layouts, and one-line errors."""

import argparse
import json
import os
import re

import pytest

from layoutlab.arguments import parse_assignments
from layoutlab.xla import available_backends
from layoutlab.xla.command import register

TINY = ["--model", "small_cnn", "--tiny", "--batch-size", "2"]


def run_cli(argv, capsys):
    parser = argparse.ArgumentParser(prog="layoutlab")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["inspect", *argv])
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_compare_layouts_table_and_json(tmp_path, capsys):
    path = tmp_path / "sub" / "cmp.json"
    # The layout's own kernel order and XLA's conv (not the CPU defaults), whose kernel
    # transposes this checks.
    plain = ["--kernel-storage", "layout", "--conv-algo", "xla", "--no-cpu-fast",
             "--activation-storage", "layout"]  # fmt: skip
    code, out, err = run_cli([*TINY, *plain, "--compare-layouts", "--json-file", str(path)], capsys)
    assert code == 0, err
    header = out.splitlines()[1].split()
    assert header == ["NHWC", "NCHW"]
    kernel_row = next(line for line in out.splitlines() if line.startswith("kernel_transposes"))
    # small_cnn has 3 convs: none of their kernels is transposed in NHWC, each one in NCHW.
    assert kernel_row.split()[1:] == ["0", "3"]
    assert "conv layouts NCHW: NCHW*OIHW->NCHW => NHWC*HWIO->NHWC: 3" in out
    data = json.loads(path.read_text())
    assert set(data) == {"NHWC", "NCHW"}
    assert data["NCHW"]["totals"]["kernel_transposes"] == 3
    assert data["NHWC"]["model_kwargs"] == {"width": 4, "hidden": 16}
    assert f"wrote {path}" in err


def test_single_report_dump_hlo_and_flags(tmp_path, capsys):
    folder = tmp_path / "hlo"
    code, out, err = run_cli(
        [
            *TINY,
            "--layout",
            "nchw",
            "--dump-hlo",
            str(folder),
            "--xla-option",
            "xla_cpu_enable_fast_math=false",
            "--no-cpu-fast",
            "--conv-algo",
            "xla",
            "--kernel-storage",
            "layout",
            "--activation-storage",
            "layout",
            "--json",
            "-",
        ],
        capsys,
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["layout"] == "NCHW"
    assert data["flags"]["compiler_options"] == {"xla_cpu_enable_fast_math": False}
    names = sorted(os.listdir(folder))
    assert names == [
        "small_cnn_NCHW_fp32_infer_cpu.after_optimizations.hlo.txt",
        "small_cnn_NCHW_fp32_infer_cpu.before_optimizations.hlo.txt",
    ]
    before = (folder / names[1]).read_text()
    after = (folder / names[0]).read_text()
    # Written NCHW, run NHWC: the pre-optimization text has the NCHW dim labels.
    assert "dim_labels=bf01_oi01->bf01" in before
    assert "dim_labels=b01f_01io->b01f" in after


def test_auto_layout_and_cache(tmp_path, capsys):
    code, out, err = run_cli(
        [*TINY, "--layout", "NCHW", "--auto-layout", "--compile-cache", str(tmp_path / "c")], capsys
    )
    assert code == 0, err
    assert "Layout.AUTO" in out
    assert "transposes default -> AUTO" in out or "refused by the backend" in out
    assert "persistent cache hit: no" in out
    assert os.listdir(tmp_path / "c")


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--backend", "tpu9"], "Available backends: "),
        (["--model", "resnet19"], "Unknown model 'resnet19'"),
        (["--precision", "fp8"], "Unknown precision policy 'fp8'"),
        (["--layout", "NWHC"], "Unknown layout 'NWHC'"),
        (
            ["--xla-option", "xla_cpu_enable_fast_math"],
            "--xla-option 'xla_cpu_enable_fast_math' is not of the form NAME=VALUE",
        ),
        (["--xla-option", "xla_no_such_flag=1"], "XLA does not know the flag"),
        (["--xla-option", "xla_cpu_enable_fast_math=maybe"], "Bad value for XLA flag"),
        (["--model-arg", "depth=3"], "unknown options \\['depth'\\]"),
        (["--conv-algo", "fastest"], "Unknown conv algorithm 'fastest'; choose one of: auto, xla"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, match, capsys):
    code, out, err = run_cli([*TINY, *argv], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert re.search(match, lines[0]), lines[0]
    assert "Traceback" not in err and out == ""


def test_a_kernel_storage_not_offered_is_one_line(capsys):
    """Every command offers the same kernel storages (train.run_flags): another is argparse's
    one line through the ``layoutlab`` parser, exit 2."""
    from layoutlab import cli

    with pytest.raises(SystemExit) as exc:
        cli.main(["inspect", *TINY, "--kernel-storage", "HWIO"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "invalid choice: 'HWIO'" in err


def test_gpu_without_gpu(capsys):
    if "gpu" in available_backends():
        pytest.skip("a GPU is present")
    code, _, err = run_cli([*TINY, "--backend", "gpu"], capsys)
    assert code == 2
    assert err.startswith("error: ") and "No GPU" in err and "Available backends: cpu" in err


def test_parse_assignments():
    assert parse_assignments(["a=1", "b=true", "c=0.5", "d=x=y"], "--flag") == {
        "a": 1,
        "b": True,
        "c": 0.5,
        "d": "x=y",
    }
    with pytest.raises(ValueError, match="--flag expects name=value"):
        parse_assignments(["=3"], "--flag")


@pytest.mark.gpu
def test_gpu_inspect(capsys):
    code, out, err = run_cli([*TINY, "--backend", "gpu", "--compare-layouts"], capsys)
    assert code == 0, err
    assert "conv layouts NCHW" in out
