"""The `layoutlab` shell: subcommands are wired, and `train --autotune` hands its choice on."""

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
