"""``bench`` prints layoutlab's fastest precision against PyTorch's fastest on the same model,
mode and batch (issue 71's "best against best"), on hand-made result rows.

The rows repeat the measured situation the number is for: layoutlab's best is fp32 while
PyTorch's best is autocast bf16, so a per-precision ratio alone would hide that PyTorch is
faster for a user who may pick either precision.
"""

import json

import pytest

from layoutlab.bench.best_vs_best import best_vs_best, markdown_best_vs_best
from layoutlab.bench.stats import paired_ratio

ROUNDS = 12


def _row(framework, precision, cls, ips, *, jitter=0.0, **extra):
    """A row of 32-image steps at ``ips`` images/s, its rounds spread by ``jitter`` (relative)."""
    median = 32 / ips * 1e3
    rounds = [median * (1 + jitter * (i - ROUNDS / 2) / ROUNDS) for i in range(ROUNDS)]
    row = {
        "framework": framework,
        "model": "resnet18",
        "model_kwargs": "{}",
        "input_shape": "32x32x3",
        "layout": "NHWC",
        "memory_format": None if framework == "layoutlab" else "channels_last",
        "precision": precision,
        "precision_class": cls,
        "mode": "train",
        "batch_size": 32,
        "images_per_sec": ips,
        "step_ms_median": median,
        "step_ms_ci_low": 0.95 * median,
        "step_ms_ci_high": 1.05 * median,
        "round_ms": json.dumps(rounds),
        "status": "ok",
    }
    row.update(extra)
    return row


def _rows():
    # The ResNet-18 CIFAR b32 train cell on a 2-core AMX Xeon, and a torch.compile
    # row timed in the same rounds as layoutlab's fp32 one (rounds that rise together).
    return [
        _row("layoutlab", "fp32", "fp32", 67.5, jitter=0.02),
        _row("layoutlab", "mixed_bf16", "half", 41.8),
        _row("layoutlab", "fp32", "fp32", 90.0, defaults="plain"),  # a baseline, not a choice
        _row("torch", "fp32", "fp32", 79.4, jitter=0.02),
        _row("torch", "amp_bf16", "half", 177.0),
        _row("torch", "fp32", "fp32", 60.0, memory_format="contiguous"),
        _row("torch.compile", "fp32", "fp32", 61.0, jitter=0.02),
        _row("layoutlab", "fp32", "fp32", 1.0, status="oom", mode="infer"),
    ]


def test_the_fastest_of_each_framework_is_compared_whatever_the_precision():
    (record,) = best_vs_best(_rows())
    assert (record["mode"], record["batch_size"]) == ("train", 32)
    assert record["layoutlab"] == "NHWC fp32" and record["images_per_sec"] == 67.5
    eager = record["torch"]
    assert eager["best"] == "channels_last/amp_bf16" and not eager["interleaved"]
    # Different precision classes ran in different groups: the medians' ratio, with the
    # widest ratio their two 95% intervals allow.
    ours_ms, theirs_ms = 32 / 67.5 * 1e3, 32 / 177.0 * 1e3
    assert eager["ratio_vs_torch_best"] == pytest.approx(theirs_ms / ours_ms)
    assert eager["ratio_ci_low"] == pytest.approx(0.95 * theirs_ms / (1.05 * ours_ms))
    assert eager["ratio_ci_high"] == pytest.approx(1.05 * theirs_ms / (0.95 * ours_ms))
    assert eager["ratio_verdict"] == "slower"


def test_one_precision_class_gets_the_paired_interval_of_the_interleaved_rounds():
    rows = _rows()
    record = best_vs_best(rows)[0]["torch.compile"]
    assert record["best"] == "channels_last/fp32" and record["interleaved"]
    ours = json.loads(rows[0]["round_ms"])
    theirs = json.loads(rows[6]["round_ms"])
    ci = paired_ratio(theirs, ours)
    assert (record["ratio_vs_torch_best"], record["ratio_ci_low"], record["ratio_ci_high"]) == (
        pytest.approx(ci.value),
        pytest.approx(ci.low),
        pytest.approx(ci.high),
    )
    assert record["ratio_vs_torch_best"] == pytest.approx(67.5 / 61.0)
    assert record["ratio_verdict"] == "faster"


def test_the_table_names_each_best_and_says_which_ratio_was_not_interleaved():
    text = markdown_best_vs_best(_rows())
    lines = text.splitlines()
    assert lines[0].startswith("Best against best")
    assert "layoutlab best vs PyTorch eager best" in lines[2]
    assert "layoutlab best vs torch.compile best" in lines[2]
    (row,) = [line for line in lines if line.startswith("| train | 32 |")]
    assert "NHWC fp32 | 67.5 | channels_last/amp_bf16 | 177.0 | 0.38 [0.35, 0.42]" in row
    assert "channels_last/fp32 | 61.0 | 1.11 [1.11, 1.11] |" in row
    assert "(not interleaved)" in row.split("channels_last/fp32")[0]
    assert row.count("(not interleaved)") == 1


def test_an_unstable_best_is_flagged_and_no_pytorch_rows_print_nothing():
    rows = _rows()
    rows[4]["unstable"] = True
    assert "(not trustworthy: unstable)" in markdown_best_vs_best(rows)
    assert markdown_best_vs_best([r for r in rows if r["framework"] == "layoutlab"]) == ""


def test_bench_prints_the_table_after_its_rows(monkeypatch, tmp_path, capsys):
    from layoutlab import cli
    from layoutlab.bench import sweep
    from layoutlab.bench.results import BenchResults

    monkeypatch.setattr(sweep, "run_sweep", lambda config, log: BenchResults({}, _rows()))
    assert cli.main(["bench", "--model", "resnet18", "--out", str(tmp_path), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert out.index("| framework |") < out.index("Best against best") < out.index("wrote ")
