"""``benchmarks/core_scaling.py``: which rows it pairs and how it computes the speed-ups,
on synthetic bench results (the real runs take minutes and their times are not tested)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "core_scaling.py"


def _load():
    spec = importlib.util.spec_from_file_location("core_scaling", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(framework, mode, batch, ms, ratio=None, defaults=None, status="ok"):
    return {"framework": framework, "mode": mode, "batch_size": batch, "step_ms_median": ms,
            "defaults": defaults, "status": status, "ratio_vs_torch_best": ratio,
            "ratio_ci_low": ratio and ratio - 0.01, "ratio_ci_high": ratio and ratio + 0.01,
            "unstable": False}  # fmt: skip


def _fake_results(cores: int) -> dict:
    # One core: layoutlab 10 ms, PyTorch 12 and 11 ms; two cores: 8 ms against 6 and 9 ms.
    ours, torch_a, torch_b = (10.0, 12.0, 11.0) if cores == 1 else (8.0, 6.0, 9.0)
    return {"rows": [
        _row("layoutlab", "infer", 1, ours, ratio=min(torch_a, torch_b) / ours, defaults="fast"),
        _row("layoutlab", "infer", 1, 99.0, defaults=None),  # a flagged variant: not the default
        _row("torch", "infer", 1, torch_a), _row("torch", "infer", 1, torch_b),
        _row("torch", "infer", 1, 1.0, status="error"),  # failed rows never count
    ]}  # fmt: skip


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable CPUs")
def test_pairs_the_default_row_with_the_faster_torch_row_and_divides_adjacent_runs(
    tmp_path, monkeypatch, capsys
):
    module = _load()
    calls = []

    def fake_bench(args, cores, out):
        calls.append(len(cores))
        return _fake_results(len(cores))

    monkeypatch.setattr(module, "_bench", fake_bench)
    out = tmp_path / "scaling"
    module.main(["--cores", "1,2", "--repeats", "2", "--out", str(out)])
    assert calls == [1, 2, 1, 2]  # the core counts alternate, repeat by repeat
    summary = json.loads(out.with_suffix(".json").read_text())
    first = summary["runs"][0]["cells"][0]
    assert (first["layoutlab_ms"], first["torch_ms"]) == (10.0, 11.0)  # the faster PyTorch row
    speedups = summary["speedups"]
    assert len(speedups) == 2
    for s in speedups:
        assert s["layoutlab_speedup"] == pytest.approx(10.0 / 8.0)
        assert s["torch_speedup"] == pytest.approx(11.0 / 6.0)
    text = out.with_suffix(".md").read_text()
    assert "| infer | 1 | 0 | 1.25 | 1.83 |" in text


def test_rejects_core_counts_this_process_cannot_use(tmp_path):
    module = _load()
    usable = len(os.sched_getaffinity(0))
    for cores in (f"1,{usable + 1}", "1,two", "1", "0,1"):
        with pytest.raises(SystemExit) as exit_info:
            module.main(["--cores", cores, "--out", str(tmp_path / "x")])
        assert exit_info.value.code == 2, cores
