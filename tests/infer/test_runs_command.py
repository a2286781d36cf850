"""``layoutlab runs DIR``: one row per run from its summary.json; a run without one, or with
an unreadable one, is a row that says so."""

import json

from cli_helpers import one_line_error, run_cli

SUMMARY = {
    "run_id": "abc",
    "model": "resnet18",
    "data": "cifar10:/data",
    "step": 300,
    "total_steps": 500,
    "epoch": 3.0,
    "best": {"metric": "val_accuracy", "mode": "max", "value": 0.91234, "step": 200},
    "final": {"val_accuracy": 0.9},
    "test": {"test_loss": 0.3, "test_accuracy": 0.8912},
    "wall_time_s": 125.25,
    "images_per_sec": 1000.0,
    "stopped_early": True,
    "stop_reason": "early stop: val_accuracy has not improved",
}


def _run(root, name, summary=None, raw=None):
    run = root / name
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"model": "small_cnn", "data": "digits"}))
    (run / "checkpoints" / "2").mkdir(parents=True)  # a run's own folders are not runs
    (run / "checkpoints" / "2" / "config.json").write_text("{}")
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))
    if raw is not None:
        (run / "summary.json").write_text(raw)
    return run


def test_runs_lists_one_row_per_run(tmp_path, capsys):
    _run(tmp_path, "a", SUMMARY)
    _run(tmp_path, "group/b")
    _run(tmp_path, "c", raw='{"model": ')  # torn
    _run(tmp_path, "d", {**SUMMARY, "best": "oops", "test": None})
    code, out, err = run_cli(capsys, "runs", tmp_path)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split() == [
        "run", "model", "data", "epochs", "best", "test_accuracy", "time", "status"
    ]  # fmt: skip
    rows = {line.split()[0]: line for line in lines[1:]}
    assert sorted(rows) == ["a", "c", "d", "group/b"]
    assert rows["a"].split()[:8] == [
        "a", "resnet18", "cifar10:/data", "3", "val_accuracy", "0.9123", "@200", "0.8912"
    ]  # fmt: skip
    assert "2m05.2s" in rows["a"] and "early stop: val_accuracy" in rows["a"]
    assert rows["group/b"].split()[:3] == ["group/b", "small_cnn", "digits"]
    assert rows["group/b"].endswith("no summary.json (unfinished)")
    assert rows["c"].endswith("unreadable summary.json: JSONDecodeError")
    assert rows["d"].endswith("unreadable summary.json: unexpected contents")

    code, out, _ = run_cli(capsys, "runs", tmp_path, "--json")
    rows = {r["run"]: r for r in json.loads(out)}
    assert rows["a"]["best"] == {"metric": "val_accuracy", "value": 0.91234, "step": 200}
    assert rows["a"]["test_accuracy"] == 0.8912 and rows["a"]["time"] == 125.25


def test_runs_of_an_empty_or_missing_dir(tmp_path, capsys):
    code, out, err = run_cli(capsys, "runs", tmp_path)
    assert (
        code == 0 and out == f"no runs under {tmp_path} (no directory there holds a config.json)\n"
    )
    code, _, err = run_cli(capsys, "runs", tmp_path / "nope")
    assert code == 2
    one_line_error(err, "is not a directory")
