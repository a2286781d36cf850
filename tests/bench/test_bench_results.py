"""Result files (CSV/JSON round trip), PyTorch ratios and plots, on hand-made rows."""

import dataclasses
import json

import pytest

from layoutlab.bench.plots import plot_all, ratio_figure
from layoutlab.bench.report import markdown_table
from layoutlab.bench.results import (
    FIELDS,
    BenchResults,
    add_torch_ratios,
    load_results,
    save_results,
    variant,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _row(framework, layout, precision, cls, mode, batch, ips, **extra):
    row = {
        "framework": framework,
        "model": "small_cnn",
        "model_kwargs": json.dumps({"width": 4}),
        "input_shape": "8x8x1",
        "num_classes": 10,
        "layout": layout,
        "memory_format": None if framework == "layoutlab" else "channels_last",
        "precision": precision,
        "precision_class": cls,
        "mode": mode,
        "batch_size": batch,
        "images_per_sec": ips,
        "step_ms_median": batch / ips * 1e3,
        "step_ms_min": batch / ips * 1e3 * 0.9,
        "step_ms_max": batch / ips * 1e3 * 1.25,
        "status": "ok",
        "error": None,
    }
    row.update(extra)
    return row


def _rows():
    rows = []
    for batch in (2, 4):
        for mode in ("infer", "train"):
            rows += [
                _row(
                    "layoutlab",
                    "NHWC",
                    "fp32",
                    "fp32",
                    mode,
                    batch,
                    1000.0 * batch,
                    compile_s=0.5,
                    flops=1.5e6,
                    temp_bytes=4096 * batch,
                    argument_bytes=7000,
                    transposes=3,
                    converts=0,
                ),
                _row(
                    "layoutlab",
                    "NHWC",
                    "mixed_bf16",
                    "half",
                    mode,
                    batch,
                    600.0 * batch,
                    temp_bytes=2048 * batch,
                    argument_bytes=7000,
                ),
                _row(
                    "torch",
                    "NCHW",
                    "fp32",
                    "fp32",
                    mode,
                    batch,
                    400.0 * batch,
                    memory_format="contiguous",
                ),
                _row("torch", "NHWC", "fp32", "fp32", mode, batch, 800.0 * batch),
                _row("torch", "NHWC", "amp_bf16", "half", mode, batch, 300.0 * batch),
            ]
    rows.append(
        {
            **_row("layoutlab", "NCHW", "fp32", "fp32", "train", 512, 1.0),
            "status": "oom",
            "images_per_sec": None,
            "error": "JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory",
        }
    )
    return rows


def test_ratio_is_layoutlab_over_best_torch_of_same_precision_class():
    rows = add_torch_ratios(_rows())
    by = {(r["framework"], r["precision"], r["mode"], r["batch_size"]): r for r in rows}
    fp32 = by[("layoutlab", "fp32", "train", 4)]
    # Best fp32 PyTorch is channels_last at 800*b images/s; layoutlab runs 1000*b.
    assert fp32["ratio_vs_torch_best"] == pytest.approx(1000 / 800)
    assert fp32["torch_best"] == "channels_last/fp32"
    half = by[("layoutlab", "mixed_bf16", "infer", 2)]
    # Half is compared with half only: amp_bf16 at 300*b, not fp32's 800*b.
    assert half["ratio_vs_torch_best"] == pytest.approx(600 / 300)
    oom = [r for r in rows if r["status"] == "oom"][0]
    assert oom.get("ratio_vs_torch_best") is None
    assert all(r.get("ratio_vs_torch_best") is None for r in rows if r["framework"] == "torch")


def test_csv_and_json_round_trip(tmp_path):
    machine = {"cpu_model": "test cpu", "versions": {"jax": "0"}, "load_average": [1.0, 0.5]}
    results = BenchResults(machine, add_torch_ratios(_rows()), ["a note"])
    save_results(tmp_path, results)
    from_json = load_results(tmp_path)
    from_csv = load_results(tmp_path, source="csv")
    assert from_json.machine == machine == from_csv.machine
    assert from_json.notes == ["a note"] == from_csv.notes
    assert from_json.rows == from_csv.rows
    assert list(from_json.rows[0]) == list(FIELDS)
    # Values survive exactly, None included (not "" or "None").
    original = {k: v for k, v in results.rows[0].items()}
    assert {k: from_csv.rows[0][k] for k in original} == original
    assert from_csv.rows[0]["temp_bytes"] == 8192 and from_csv.rows[0]["device_peak_bytes"] is None


def test_load_results_missing_and_bad_columns(tmp_path):
    with pytest.raises(FileNotFoundError, match="layoutlab bench"):
        load_results(tmp_path / "nothing")
    with pytest.raises(ValueError, match="Unknown result columns"):
        save_results(tmp_path, BenchResults({}, [{**_rows()[0], "speed": 1.0}]))


def test_plots_are_written(tmp_path):
    paths = plot_all(add_torch_ratios(_rows()), tmp_path)
    assert sorted(p.name for p in paths) == ["memory.png", "ratio_vs_torch.png", "throughput.png"]
    for p in paths:
        assert p.read_bytes()[:8] == PNG_MAGIC and p.stat().st_size > 5000
    # Without PyTorch rows there is no ratio chart.
    only_ll = [r for r in _rows() if r["framework"] == "layoutlab"]
    names = sorted(p.name for p in plot_all(only_ll, tmp_path / "ll"))
    assert names == ["memory.png", "throughput.png"]


def _overlapping_texts(fig) -> list[tuple[str, str]]:
    """Pairs of visible texts (tick labels, axis labels, title, values) whose drawn
    bounding boxes overlap."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    boxes = [
        (t.get_text(), t.get_window_extent(renderer))
        for t in fig.findobj(Text)
        if t.get_visible() and t.get_text().strip()
    ]
    return [
        (a, b)
        for i, (a, box) in enumerate(boxes)
        for b, other in boxes[i + 1 :]
        if box.overlaps(other)
    ]


@pytest.mark.parametrize("batches", [(1,), (1, 2, 4), (1, 2, 4, 8, 16, 32, 64, 128, 256)])
def test_ratio_chart_texts_do_not_overlap(batches):
    # Long variant labels and ratios from 0.25x to 4x: the tilted labels ran into each other
    # and the axis label, and every minor tick's label put 0.9 on top of 1.
    rows = []
    for i, (batch, mode, layout) in enumerate(
        (b, m, lay) for b in batches for m in ("infer", "train") for lay in ("NHWC", "NCHW")
    ):
        ratio = 4.0 ** (((i * 7) % 9) / 4 - 1)  # 0.25 .. 4
        setting = {"conv_algo": "auto", "kernel_storage": "channels_last"}
        setting["activation_storage"] = "channels_last"
        rows.append(_row("layoutlab", layout, "fp32", "fp32", mode, batch, 100 * ratio, **setting))
        rows.append(_row("torch", layout, "fp32", "fp32", mode, batch, 100.0))
    fig = ratio_figure(add_torch_ratios(rows))
    assert len(fig.axes[0].patches) == 4 * len(batches)
    assert _overlapping_texts(fig) == []


def test_markdown_table_has_one_line_per_row_and_flags_failures():
    rows = add_torch_ratios(_rows())
    table = markdown_table(rows).splitlines()
    assert len(table) == 2 + len(rows)
    assert any("**oom**" in line and "| 512 |" in line for line in table)
    assert any("| 1.25 |" in line for line in table)  # fp32 ratio 1000/800


def test_a_run_on_xlas_batch_norms_and_max_pools_is_not_labelled_the_defaults():
    # --layer-impl xla changes the program: its rows are custom and their variant says so.
    from layoutlab.bench.sweep_config import defaults_label
    from layoutlab.fast_defaults import default_activation_storage, default_kernel_storage
    from layoutlab.train.config import TrainConfig

    fast = TrainConfig(
        kernel_storage=default_kernel_storage("cpu"),
        activation_storage=default_activation_storage("cpu"),
    )
    assert defaults_label(fast, "cpu") == "fast"
    assert defaults_label(dataclasses.replace(fast, layer_impl="xla"), "cpu") == "custom"
    row = {"framework": "layoutlab", "defaults": "custom", "conv_algo": "auto",
           "kernel_storage": "channels_last", "layout": "NHWC", "layer_impl": "xla"}  # fmt: skip
    assert variant(row) == "auto+hwio +xla_layers"
    assert variant({**row, "layer_impl": "auto"}) == "auto+hwio"
