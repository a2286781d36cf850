"""The `layoutlab` shell: subcommands are wired, and `train --autotune` hands its choice on."""

import argparse
from pathlib import Path

import pytest

from layoutlab import cli


def test_every_subcommand_is_registered():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) == {
        "train",
        "evaluate",
        "predict",
        "export",
        "runs",
        "models",
        "data",
        "inspect",
        "compare",
        "bench",
        "autotune",
        "conv-autotune",
    }


def test_models_lists_the_registry(capsys):
    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    assert "resnet18" in out and "small_cnn3d" in out


def test_train_autotune_passes_the_choice_to_training(monkeypatch, tmp_path):
    import layoutlab.bench.tuning as autotune
    import layoutlab.train.loop as loop

    seen = {}

    def fake_autotune_config(model, batch_size, input_shape, **kw):
        seen["asked"] = (model, batch_size, tuple(input_shape), kw["num_classes"])
        return "NCHW", "mixed_bf16"

    def fake_train(config, workdir, **kw):
        seen["trained"] = (config.layout, config.precision)
        return {"step": 0, "test_accuracy": 0.0, "test_loss": 0.0}

    monkeypatch.setattr(autotune, "autotune_config", fake_autotune_config)
    monkeypatch.setattr(loop, "train_and_evaluate", fake_train)
    rc = cli.main(["train", "--autotune", "--workdir", str(tmp_path / "w"), "--quiet"])
    assert rc == 0
    assert seen["asked"] == ("small_cnn", 32, (8, 8, 1), 10)
    assert seen["trained"] == ("NCHW", "mixed_bf16")


def test_no_command_prints_help_and_fails(capsys):
    assert cli.main([]) == 2
    assert "usage" in capsys.readouterr().out


def test_unknown_command_is_an_argparse_error():
    with pytest.raises(SystemExit):
        cli.main(["fly"])


class _ReadOnlyNamespace(argparse.Namespace):
    """A parsed command line that a command may read but not write."""

    def __setattr__(self, name, value):
        raise AssertionError(f"a command wrote args.{name} = {value!r} after parsing")


def _read_only_after_parsing(monkeypatch):
    """The top-level parser's namespaces come back read-only (the subcommand parsers still
    fill theirs, which argparse copies into the top-level one while parsing)."""
    parse = argparse.ArgumentParser.parse_known_args

    def parse_known_args(self, args=None, namespace=None):
        parsed, rest = parse(self, args, namespace)
        if self.prog != "layoutlab":
            return parsed, rest
        frozen = _ReadOnlyNamespace.__new__(_ReadOnlyNamespace)
        frozen.__dict__.update(vars(parsed))
        return frozen, rest

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse_known_args)


def test_train_autotune_hands_its_choice_on_as_values_not_through_the_namespace(
    monkeypatch, tmp_path
):
    """``train --autotune`` returns its layout and precision and the conv planner is an
    argument of training: the command builds its config once and writes nothing into the
    parsed flags (issue 68: they were written back into ``args`` and the config built again)."""
    import layoutlab.bench.tuning as autotune
    import layoutlab.train.command as train_command
    import layoutlab.train.loop as loop

    seen = {"builds": 0}
    build = train_command.build_config

    def counted_build(args):
        seen["builds"] += 1
        return build(args)

    def fake_train(config, workdir, **kw):
        seen["trained"] = (config.layout, config.precision, workdir, kw["conv_planner"])
        return {"step": 0, "test_accuracy": 0.0, "test_loss": 0.0}

    monkeypatch.setattr(autotune, "autotune_config", lambda *a, **kw: ("NCHW", "mixed_bf16"))
    monkeypatch.setattr(loop, "train_and_evaluate", fake_train)
    monkeypatch.setattr(train_command, "build_config", counted_build)
    _read_only_after_parsing(monkeypatch)
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["train", "--autotune", "--quiet", "--set", "precision=fp16"])
    assert rc == 0
    layout, precision, workdir, planner = seen["trained"]
    assert (layout, precision) == ("NCHW", "fp16")  # --set still has the last word
    assert workdir.parent == Path("runs") and workdir.name.startswith("small_cnn-")
    assert callable(planner)  # the planner of "auto" convs, passed as an argument
    assert seen["builds"] == 1


def test_bench_takes_its_command_line_as_an_argument(monkeypatch, tmp_path, capsys):
    """``bench`` reruns its command line per host-memory part: ``cli.main`` passes it as an
    argument instead of writing it into the parsed flags."""
    _read_only_after_parsing(monkeypatch)
    rc = cli.main(["bench", "--model", "no_such_model", "--out", str(tmp_path / "b")])
    assert rc == 2
    assert "no_such_model" in capsys.readouterr().err
