"""One vocabulary across commands: ``--mode train|infer``, ``--xla-option``, ``--model-arg``,
``--cache``/``--compile-cache``; every old spelling still parses to the same value, with one
``warning:`` line naming the new one. The README's and docs' command blocks use only the new
ones."""

import re
from pathlib import Path

import pytest

from layoutlab import cli
from layoutlab.train.command import build_config
from layoutlab.train.run_flags import run_config

README = Path(__file__).resolve().parents[2] / "README.md"


def _parse(capsys, *argv):
    args = cli.build_parser().parse_args(list(argv))
    return args, capsys.readouterr().err


TUNE = ["--model", "m", "--batch-size", "2"]

# (old command line, new command line, the attribute both must set)
ALIASES = [
    (["inspect", "--flag", "a=1"], ["inspect", "--xla-option", "a=1"], "xla_option"),
    (["inspect", "--cache-dir", "d"], ["inspect", "--compile-cache", "d"], "compile_cache"),
    (["inspect", "--mode", "eval"], ["inspect", "--mode", "infer"], "mode"),
    (
        ["compare", "--model", "m", "--against", "fp32", "--mode", "eval"],
        ["compare", "--model", "m", "--against", "fp32", "--mode", "infer"],
        "mode",
    ),
    (
        ["autotune", "convs", *TUNE, "--objective", "inference"],
        ["autotune", "convs", *TUNE, "--mode", "infer"],
        "mode",
    ),
    (
        ["autotune", "convs", *TUNE, "--objective", "train"],
        ["autotune", "convs", *TUNE, "--mode", "train"],
        "mode",
    ),
    (
        ["autotune", "layout", *TUNE, "--image-size", "8", "--mode", "inference"],
        ["autotune", "layout", *TUNE, "--image-size", "8", "--mode", "infer"],
        "mode",
    ),
]


@pytest.mark.parametrize(("old", "new", "dest"), ALIASES, ids=lambda v: " ".join(v)[:40])
def test_old_spellings_warn_and_mean_the_new_ones(old, new, dest, capsys):
    old_args, old_err = _parse(capsys, *old)
    new_args, new_err = _parse(capsys, *new)
    assert getattr(old_args, dest) == getattr(new_args, dest)
    assert new_err == ""
    lines = old_err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: ") and "deprecated" in lines[0]
    assert new[new.index(next(a for a in new if a not in old))] in lines[0]


def test_repeated_old_and_new_xla_options_collect_together(capsys):
    args, err = _parse(capsys, "inspect", "--xla-option", "a=1", "--flag", "b=2")
    assert args.xla_option == ["a=1", "b=2"] and err.count("warning:") == 1


def test_mode_is_train_or_infer_everywhere(capsys):
    for argv in (["inspect"], ["compare", "--model", "m", "--against", "fp32"]):
        with pytest.raises(SystemExit):
            _parse(capsys, *argv, "--mode", "evaluate")
        assert "choose train or infer" in capsys.readouterr().err


def test_model_arg_is_one_form(capsys):
    args, _ = _parse(capsys, "train", "--model-arg", "width=8", "--model-arg", "stem=cifar")
    via_set, _ = _parse(
        capsys, "train", "--set", "model_kwargs.width=8", "--set", "model_kwargs.stem=cifar"
    )
    assert (
        build_config(args)[0].model_kwargs
        == build_config(via_set)[0].model_kwargs
        == {
            "width": 8,
            "stem": "cifar",
        }
    )
    bench, _ = _parse(
        capsys, "bench", "--model", "small_cnn", "--out", "o", "--model-arg", "width=8"
    )
    assert run_config(bench).model_kwargs == {"width": 8}
    tune, _ = _parse(
        capsys, "autotune", "convs", "--model", "small_cnn", "--batch-size", "2",
        "--model-arg", "width=8",
    )  # fmt: skip
    assert run_config(tune).model_kwargs == {"width": 8}


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--model-arg", "width", "--workdir", "unused"],
        ["compare", "--model", "small_cnn", "--against", "layout", "--model-arg", "=3"],
    ],
)
def test_a_malformed_model_arg_is_one_line(argv, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "NAME=VALUE" in err[0], err


def test_docs_commands_use_only_the_new_spellings():
    from test_readme import PAGES  # the README and the hand-written docs pages

    text = "\n".join(page.read_text() for page in PAGES)
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", text, flags=re.S))
    inline = " ".join(re.findall(r"`(layoutlab [^`]*)`", text))
    for old in ("--flag ", "--cache-dir", "--objective", "--mode eval", "--mode inference",
                "--input-shape"):  # fmt: skip
        assert old not in blocks, old
        assert old not in inline, old
