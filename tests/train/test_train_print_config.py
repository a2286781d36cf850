"""``layoutlab train --print-config``: the config a run would record, shown without running."""

import json

import pytest
from cli_helpers import one_line_error, run_cli

# Decided only once a run starts (its id, and its conv plans when none is given).
DECIDED_AT_START = ("run_id", "conv_plan", "eval_conv_plan")


def test_print_config_is_what_the_run_records_and_writes_nothing(
    guarantees_run, tmp_path, monkeypatch, capsys
):
    # conftest's guarantees_run trained with these flags; here half come from --config.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "base.yaml").write_text("num_steps: 4\nbatch_size: 32\nseed: 1\n")
    argv = ["train", "--config", "base.yaml", "--set", "eval_every=2", "--print-config"]
    argv += ["--set", "model_kwargs.width=4", "--set", "model_kwargs.hidden=16"]
    code, out, err = run_cli(capsys, *argv, "--workdir", tmp_path / "run")
    assert code == 0, err
    printed = json.loads(out)
    recorded = json.loads((guarantees_run / "config.json").read_text())
    for name in DECIDED_AT_START:
        assert printed.pop(name) is None
        recorded.pop(name)
    # Every automatic field filled in as the run filled it (loss scale, storages, data
    # parallelism over conftest's 4 devices, eval batch), the data fingerprint included.
    assert printed == recorded
    assert printed["loss_scale"] == "none" and printed["eval_batch_size"] == 512
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.yaml"]  # no workdir, no file
    # The printed config is a --config file that resolves to itself.
    (tmp_path / "printed.json").write_text(out)
    code, again, err = run_cli(capsys, "train", "--config", "printed.json", "--print-config")
    assert code == 0, err
    assert json.loads(again) == {**printed, **dict.fromkeys(DECIDED_AT_START)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.yaml", "printed.json"]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--set", "batch_size=4000"], ["larger than the 1438 training examples"]),
        (["--config", "missing.yaml"], ["missing.yaml", "cannot be read"]),
        (["--set", "model_kwargs.width=-3"], ["model_kwargs"]),
        (["--set", "nosuchfield=1"], ["nosuchfield"]),
    ],
)
def test_print_config_refuses_bad_input_as_train_does(tmp_path, monkeypatch, capsys, argv, words):
    monkeypatch.chdir(tmp_path)
    lines = []
    for extra in (["--print-config"], []):
        code, _, err = run_cli(capsys, "train", *argv, *extra, "--workdir", "run", "--quiet")
        assert code == 2
        lines.append(one_line_error(err, *words))
    assert lines[0] == lines[1]
    assert not any(tmp_path.iterdir())


def test_print_config_with_autotune_is_an_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "train", "--print-config", "--autotune")
    assert code == 2
    one_line_error(err, "--autotune")
    assert not any(tmp_path.iterdir())


def test_print_config_on_resume_shows_the_runs_record_and_changes_nothing(copy, capsys):
    before = {p: p.stat().st_mtime_ns for p in copy.rglob("*")}
    code, out, err = run_cli(capsys, "train", "--workdir", copy, "--resume", "--print-config")
    assert code == 0, err
    # A resumed run keeps its id and conv plans: its record, unchanged.
    assert json.loads(out) == json.loads((copy / "config.json").read_text())
    assert {p: p.stat().st_mtime_ns for p in copy.rglob("*")} == before
