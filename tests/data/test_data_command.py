"""`layoutlab data --data ...` prints a summary or a clear error."""

import argparse
import json

import pytest

from layoutlab.data import command


def _run(argv):
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    args = parser.parse_args(["data", *argv])
    return args.func(args)


def test_summary_text_and_json(capsys):
    assert _run(["--data", "synthetic:6x6x3:4:50", "--seed", "1"]) == 0
    text = capsys.readouterr().out
    assert "40 / 10 images" in text and "6x6x3" in text
    assert _run(["--data", "synthetic:6x6x3:4:50", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["num_classes"] == 4 and len(summary["mean"]) == 3
    assert sum(summary["train_class_counts"]) == summary["train_size"] == 40


def test_errors_exit_nonzero(capsys, tmp_path):
    assert _run(["--data", f"mnist:{tmp_path / 'missing'}"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert _run(["--data", "imagenet"]) == 2
    err = capsys.readouterr().err
    assert "valid forms are: digits, cifar10:DIR" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit):  # argparse's error: one line in `layoutlab data`
        _run(["--data", f"folder:{tmp_path}", "--image-size", "3x"])
    assert "expected N, HxW or H,W" in capsys.readouterr().err
