"""The sweep: a real tiny run beside PyTorch, failures as rows, and early errors."""

import argparse
import dataclasses
import sys
import time

import jax
import pytest

from layoutlab import models
from layoutlab.bench import command
from layoutlab.bench.results import load_results
from layoutlab.bench.sweep import SweepConfig, run_sweep
from layoutlab.cli import build_parser
from layoutlab.train.config import TrainConfig
from layoutlab.train.spec import config_for

TINY = models.spec("small_cnn").tiny


@pytest.fixture(scope="module")
def real_sweep():
    torch = pytest.importorskip("torch")
    # One PyTorch thread: on a busy 2-core machine two OpenMP threads wait on each other
    # for whole scheduler slices, which makes tiny steps take ~100x longer.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    config = SweepConfig(
        config_for("pytorch", model="small_cnn", model_kwargs=TINY, batch_size=2),
        axes={"precision": ("fp32",)},
        modes=("infer", "train"),
        repeats=2,
        warmup=1,
        torch=True,
    )
    try:
        yield run_sweep(config)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.torch
def test_real_sweep_rows_have_positive_timings(real_sweep):
    rows = real_sweep.rows
    # 2 modes x (1 layoutlab + 2 PyTorch memory formats).
    assert len(rows) == 6 and all(r["status"] == "ok" for r in rows), rows
    for r in rows:
        assert 0 < r["step_ms_min"] <= r["step_ms_median"] <= r["step_ms_max"]
        assert r["images_per_sec"] == pytest.approx(2 / (r["step_ms_median"] / 1e3))
        assert r["peak_rss_bytes"] > 0 and r["repeats"] == 2 and r["warmup"] == 1
    ll = {r["mode"]: r for r in rows if r["framework"] == "layoutlab"}
    for r in ll.values():
        assert r["compile_s"] > 0 and r["flops"] > 0 and r["gflops_per_sec"] > 0
        assert r["argument_bytes"] > 0 and r["temp_bytes"] >= 0
        assert r["transposes"] >= 0 and r["converts"] >= 0
    # A train step does the forward pass and more (backward, update).
    assert ll["train"]["flops"] > ll["infer"]["flops"]
    assert {r["memory_format"] for r in rows if r["framework"] == "torch"} == {
        "contiguous",
        "channels_last",
    }
    assert real_sweep.machine["versions"]["jax"] == jax.__version__
    assert real_sweep.machine["torch_threads"] == 1
    assert {r["threads"] for r in rows if r["framework"] == "torch"} == {1}


@pytest.mark.torch
def test_real_sweep_ratio_uses_best_torch_row(real_sweep):
    for mode in ("infer", "train"):
        ll = [r for r in real_sweep.rows if r["framework"] == "layoutlab" and r["mode"] == mode]
        torch_rows = [r for r in real_sweep.rows if r["framework"] == "torch" and r["mode"] == mode]
        best = max(r["images_per_sec"] for r in torch_rows)
        assert ll[0]["ratio_vs_torch_best"] == pytest.approx(ll[0]["images_per_sec"] / best)


class FakeRunner:
    """Stands in for JaxRunner; ``fail`` maps a batch size to (phase, exception)."""

    def __init__(self, case, fail, calls):
        self.case, self.fail, self.calls = case, fail, calls

    def row(self):
        return self.case.row()

    def _maybe_fail(self, phase):
        how = self.fail.get(self.case.workload.batch_size)
        if how is not None and how[0] == phase:
            raise how[1]

    def setup(self):
        self.calls.append(("setup", self.case.workload.batch_size))
        self._maybe_fail("setup")
        return {"compile_s": 0.1, "flops": 1e6}

    def step(self):
        self._maybe_fail("step")

    def finish(self):
        return {"peak_rss_bytes": 1}

    def close(self):
        pass


def _fake_sweep(fail, optimizer="train", **kw):
    calls = []
    config = SweepConfig(
        config_for(optimizer, model="small_cnn", model_kwargs=TINY),
        axes={"batch_size": (2, 64, 128, 4)},
        modes=("infer",),
        repeats=2,
        warmup=1,
        **kw,
    )
    results = run_sweep(config, jax_runner=lambda case: FakeRunner(case, fail, calls))
    return results, calls


def test_oom_and_error_rows_and_the_sweep_goes_on():
    oom = jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate")
    results, calls = _fake_sweep(
        {64: ("setup", oom), 128: ("step", ValueError("something else broke"))}
    )
    status = {r["batch_size"]: r["status"] for r in results.rows}
    assert status == {2: "ok", 64: "oom", 128: "error", 4: "ok"}
    failed = {r["batch_size"]: r["error"] for r in results.rows if r["status"] != "ok"}
    assert "RESOURCE_EXHAUSTED" in failed[64] and "something else broke" in failed[128]
    # The batch after the failures was still set up and measured.
    assert ("setup", 4) in calls


def test_torch_missing_is_a_note_and_layoutlab_still_runs(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    results, _ = _fake_sweep({}, "pytorch", torch=True)
    assert any("PyTorch is not installed" in n and "layoutlab[torch]" in n for n in results.notes)
    assert {r["framework"] for r in results.rows} == {"layoutlab"}
    assert all(r["status"] == "ok" for r in results.rows)


class SlowNCHW(FakeRunner):
    def step(self):
        if self.case.layout == "NCHW":
            time.sleep(0.03)


def test_slow_configurations_are_skipped_and_predicted():
    calls = []
    config = SweepConfig(
        TrainConfig(model="small_cnn", model_kwargs=TINY),
        axes={"layout": ("NHWC", "NCHW"), "batch_size": (2, 4)},
        modes=("infer", "train"), repeats=2, warmup=1, max_step_s=0.02,
    )  # fmt: skip
    results = run_sweep(config, jax_runner=lambda case: SlowNCHW(case, {}, calls))
    rows = {(r["mode"], r["batch_size"], r["layout"]): r for r in results.rows}
    assert len(rows) == 8
    assert all(r["status"] == "ok" for k, r in rows.items() if k[2] == "NHWC")
    # infer b2's first measured step took 0.03 s > 0.02 s and it stopped; the rest (bigger
    # batch, training) are predicted slower still and never set up.
    assert rows[("infer", 2, "NCHW")]["status"] == "skipped"
    assert "a measured step took" in rows[("infer", 2, "NCHW")]["error"]
    for key in [("infer", 4, "NCHW"), ("train", 2, "NCHW"), ("train", 4, "NCHW")]:
        assert rows[key]["status"] == "skipped" and "predicted" in rows[key]["error"]
    assert [c for c in calls if c[1] == 4].count(("setup", 4)) == 2  # NHWC infer + train


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"run": TrainConfig(model="resnet9000")}, "Unknown model 'resnet9000'"),
        ({"axes": {"precision": ("fp32", "fp12")}}, "Unknown precision policy 'fp12'"),
        ({"modes": ("infer", "serve")}, "Unknown modes"),
        ({"axes": {"batch_size": (0,)}}, "positive ints"),
        ({"axes": {"layout": ("NWHC",)}}, "NWHC"),
        ({"axes": {"layout": ()}}, "axis layout is empty"),
        # PyTorch rows run SGD with momentum: layoutlab's side of a ratio must too.
        ({"torch": True}, "must make the same update"),
        # The auto repeats' stopping rule: a budget and a relative target it can meet.
        ({"time_budget_s": 0}, "time_budget_s be > 0"),
        ({"target": 1.5}, "target must lie in"),
    ],
)
def test_bad_arguments_fail_before_anything_runs(change, message):
    base = dict(run=TrainConfig(model="small_cnn", model_kwargs=TINY), modes=("infer",))
    config = SweepConfig(**{**base, **change})

    def never(case):
        raise AssertionError("a runner was built for an invalid sweep")

    with pytest.raises(ValueError, match=message):
        run_sweep(config, jax_runner=never)


def test_the_train_step_runs_trains_optimizer_unless_pytorch_sits_beside_it(tmp_path):
    def run(*flags):
        argv = ["bench", "--model", "small_cnn", "--modes", "train", *flags, "--out", "o"]
        return command._sweep_config(build_parser().parse_args(argv)).run

    assert run().optimizer == "adamw"
    assert run("--torch") == config_for("pytorch", model="small_cnn")
    assert run("--optimizer", "pytorch").optimizer == "momentum"
    with pytest.raises(ValueError, match="drop --optimizer train"):
        run("--torch", "--optimizer", "train")


def _cli(argv):
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def test_bench_cli_writes_results_and_plots(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["bench", "--model", "small_cnn", "--tiny", "--layouts", "NHWC", "--precisions",
            "fp32", "--batch-sizes", "2", "--modes", "infer", "--repeats", "2", "--warmup", "0",
            "--backend", "cpu", "--out", str(out)]  # fmt: skip
    assert _cli(argv) == 0
    names = {p.name for p in out.iterdir()}
    assert {"results.csv", "results.json", "machine.json", "throughput.png", "memory.png"} <= names
    rows = load_results(out, source="csv").rows
    assert [(r["framework"], r["status"]) for r in rows] == [("layoutlab", "ok")]
    assert "| layoutlab | infer | 2 | NHWC | fp32 |" in capsys.readouterr().out


def test_bench_cli_bad_precision_is_a_clear_error(tmp_path, capsys):
    argv = ["bench", "--model", "small_cnn", "--precisions", "fp33", "--out", str(tmp_path)]
    assert _cli(argv) == 2
    assert "Unknown precision policy 'fp33'" in capsys.readouterr().err


def test_prediction_prefers_the_same_mode_then_scales_inference():
    from layoutlab.bench.step_limit import predicted_step_s as _predicted_step_s

    base = {"framework": "torch", "layout": "NHWC", "precision": "amp_bf16", "model": "m",
            "model_kwargs": "{}", "input_shape": "8x8x1"}  # fmt: skip
    history = [
        ({**base, "mode": "infer", "batch_size": 128}, 10.0),
        ({**base, "mode": "train", "batch_size": 32}, 17.0),
        ({**base, "layout": "NCHW", "mode": "train", "batch_size": 32}, 1.0),  # other layout
    ]
    # Training at 128 scales the training run at 32 (x4), not the faster inference run.
    guess, past = _predicted_step_s({**base, "mode": "train", "batch_size": 128}, history)
    assert guess == pytest.approx(68.0) and past["mode"] == "train"
    # With no training run yet, inference x2 stands in: 10 s at 128 -> 20 s at 128.
    guess, _ = _predicted_step_s({**base, "mode": "train", "batch_size": 128}, history[:1])
    assert guess == pytest.approx(20.0)
    # Nothing smaller to go by: no prediction.
    assert _predicted_step_s({**base, "mode": "infer", "batch_size": 64}, history) is None


def test_an_inference_row_reads_onednn_kernels_packed_once():
    """bench's inference step runs oneDNN's convs on kernels packed before the timed steps,
    as predict does (nn.conv_algos.onednn_packed), and counts their work as before."""
    from layoutlab.nn.conv_algos import onednn

    if not onednn.available():
        pytest.skip(f"onednn extension: {onednn.unavailable_reason()}")
    config = SweepConfig(
        config_for("pytorch", model="small_cnn", model_kwargs=TINY, batch_size=4,
                   conv_algorithm="onednn"),
        axes={"precision": ("fp32",)},
        modes=("infer",),
        repeats=1,
        warmup=0,
        roofline=False,
    )  # fmt: skip
    (row,) = run_sweep(config).rows
    assert row["status"] == "ok" and row["packed_kernels"] >= 1, row
    # The packed calls' flops count as the plain forwards' would (xla.custom_call_cost).
    plain = run_sweep(dataclasses.replace(config, pack_kernels=False)).rows[0]
    assert plain["packed_kernels"] == 0 and row["flops"] == plain["flops"] > 0


def test_no_pack_kernels_flag_reaches_the_sweep():
    for flags, want in (([], True), (["--no-pack-kernels"], False)):
        args = build_parser().parse_args(["bench", "--model", "small_cnn", "--out", "o", *flags])
        assert command._sweep_config(args).pack_kernels is want
