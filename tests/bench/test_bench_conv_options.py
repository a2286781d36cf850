"""Conv algorithms, kernel storage and XLA options in the benchmark sweep and its CLIs."""

import argparse
import json

import jax.numpy as jnp
import numpy as np
import pytest

from layoutlab import models
from layoutlab.bench import command
from layoutlab.bench.jax_runner import JaxRunner, case_model
from layoutlab.bench.results import load_results, variant
from layoutlab.bench.sweep import SweepConfig, run_sweep
from layoutlab.bench.timing import JaxStep
from layoutlab.bench.tuning import command as autotune_command
from layoutlab.nn.conv_algos import ConvPlan
from layoutlab.nn.conv_config import conv_settings
from layoutlab.train.config import TrainConfig
from layoutlab.train.spec import config_for

TINY = models.spec("small_cnn").tiny
EIGEN = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


class _FakeRunner:
    """Records the case it was built for; set-up and steps do nothing."""

    def __init__(self, case):
        self.case = case

    def row(self):
        return self.case.row()

    def setup(self):
        return {}

    def step(self):
        pass

    def finish(self):
        return {}

    def close(self):
        pass


def _recorder(seen: list):
    def build(case):
        seen.append(case)
        return _FakeRunner(case)

    return build


def _cli(argv):
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    command.register(subparsers)
    autotune_command.register(subparsers)
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"axes": {"conv_algorithm": ("xla", "fft")}}, "Unknown conv algorithm 'fft'"),
        ({"axes": {"conv_algorithm": ()}}, "axis conv_algorithm is empty"),
        ({"kernel_storage": "OIHW"}, "Unknown kernel_storage 'OIHW'"),
        ({"xla_options": {"xla_cpu_no_such_flag": True}}, "xla_cpu_no_such_flag"),
        ({"xla_options": {"xla_cpu_enable_fast_math": [1]}}, "use a bool, int, float or str"),
        ({"conv_tune_repeats": 0}, "conv_tune_repeats"),
    ],
)
def test_bad_conv_settings_fail_before_anything_runs(change, message):
    axes = change.pop("axes", {})
    measure = {k: change.pop(k) for k in ("conv_tune_repeats",) if k in change}
    run = TrainConfig(model="small_cnn", model_kwargs=TINY, **change)
    config = SweepConfig(run, axes=axes, modes=("infer",), **measure)

    def never(case):
        raise AssertionError("a runner was built for an invalid sweep")

    with pytest.raises(ValueError, match=message):
        run_sweep(config, jax_runner=never)


def test_each_conv_algorithm_is_a_configuration_with_its_settings_in_the_row():
    seen = []

    run = TrainConfig(
        model="small_cnn",
        model_kwargs=TINY,
        layout="NCHW",
        batch_size=2,
        kernel_storage="channels_last",
        xla_options=EIGEN,
    )
    config = SweepConfig(
        run, {"conv_algorithm": ("xla", "im2col", "xla")}, ("infer",), repeats=1, warmup=0
    )
    rows = run_sweep(config, jax_runner=_recorder(seen)).rows
    assert [c.conv_algo for c in seen] == ["xla", "im2col"]  # duplicates dropped
    assert {r["kernel_storage"] for r in rows} == {"channels_last"}
    assert all(json.loads(r["xla_options"]) == EIGEN for r in rows)
    assert [variant(r) for r in rows] == [
        "xla+hwio+channels_last_inside +experimental_ynn_fusion_type",
        "im2col+hwio+channels_last_inside +experimental_ynn_fusion_type",
    ]
    assert variant({"framework": "torch", "conv_algo": "im2col"}) == ""


def test_runner_applies_the_conv_settings_to_the_model_it_times():
    run = TrainConfig(
        model="small_cnn", model_kwargs=TINY, layout="NCHW", batch_size=2,
        kernel_storage="channels_last",
    )  # fmt: skip
    config = SweepConfig(run, {"conv_algorithm": ("xla", "im2col")}, ("infer",), repeats=1,
                         warmup=0)  # fmt: skip
    hlo = {}

    class Recording(JaxRunner):
        def setup(self):
            fields = super().setup()
            hlo[self.case.conv_algo] = self.step_fn.compiled.as_text()
            return fields

    rows = run_sweep(config, jax_runner=lambda case: Recording(case, backend="cpu")).rows
    assert [r["status"] for r in rows] == ["ok", "ok"], [r["error"] for r in rows]
    # HWIO kernels in an NCHW model: every conv of the built model says so.
    model = case_model(_case("im2col"))
    assert set(conv_settings(model).values()) == {("im2col", "HWIO")}
    # The setting reaches the compiled step: im2col replaces every convolution by patches
    # and a dot, while the native algorithm keeps XLA convolutions.
    assert " convolution(" in hlo["xla"]
    assert " convolution(" not in hlo["im2col"]


def _case(algo):
    from layoutlab.bench.cases import JaxCase, make_workload

    w = make_workload("small_cnn", TINY, (8, 8, 1), 10, "infer", 2)
    return JaxCase.of(w, layout="NCHW", conv_algorithm=algo, kernel_storage="channels_last")


def test_compile_options_reach_the_executable():
    bad = JaxStep(lambda x: x * 2, (jnp.ones(3),), compiler_options={"xla_cpu_bogus": 1})
    with pytest.raises(Exception, match="xla_cpu_bogus"):
        bad.compile()
    good = JaxStep(
        lambda x: x * 2, (jnp.ones(3),), compiler_options={"xla_cpu_enable_fast_math": False}
    )
    good.compile()
    good()  # the call reuses the AOT executable: the guard would raise on a recompile
    np.testing.assert_array_equal(np.asarray(good.outputs), np.full(3, 2.0, np.float32))


def test_bench_cli_conv_flags_and_conv_autotune_cli(tmp_path, capsys, monkeypatch):
    cache = tmp_path / "convs.json"
    monkeypatch.setenv("LAYOUTLAB_AUTOTUNE_CACHE", str(cache))
    # LLVM's level 0 (XLA's HLO passes and fusions unchanged): what is checked is the CLIs'
    # plumbing, and every program compiled here (the tuning's candidates, checked against
    # float64 each, and the bench rows) compiles about 2x faster. It also shows that two
    # --xla-option flags both reach the rows' label, in the order given.
    common = ["--model", "small_cnn", "--tiny", "--backend", "cpu", "--kernel-storage",
              "channels_last", "--xla-option", "xla_backend_optimization_level=0",
              "--xla-option", "xla_cpu_enable_fast_math=false", "--no-cpu-fast"]  # fmt: skip
    plan_file = tmp_path / "plan.json"
    # In mixed bfloat16 the Winograd F(4x4) variants refuse every conv, leaving 4 candidates
    # a shape to compile and check instead of 7: what is checked here is the CLI.
    tune = ["autotune", "convs", *common, "--batch-size", "2", "--layout", "NCHW",
            "--precision", "mixed_bf16", "--repeats", "1", "--mode", "infer",
            "--out", str(plan_file)]  # fmt: skip
    assert _cli(tune) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "warning:" not in captured.err
    assert "(0 from the cache)" in out and "[inference] ->" in out
    shapes = int(out.split(" conv shapes (")[0].rsplit("\n", 1)[-1])
    plan = ConvPlan.from_json(plan_file.read_text())
    assert f"wrote the conv plan ({len(plan)} convs) to {plan_file}" in out
    assert len({e.spec_key for _, e in plan.items()}) == shapes
    # The deprecated spelling still works, says so on stderr, and reads the same cache.
    assert _cli(["conv-autotune", *tune[2:]]) == 0
    captured = capsys.readouterr()
    assert f"{shapes} conv shapes ({shapes} from the cache)" in captured.out
    assert "warning: `layoutlab conv-autotune` is deprecated" in captured.err
    again = ConvPlan.from_json(plan_file.read_text())
    assert dict(again.items()) == dict(plan.items())  # same choices for the same convs
    assert {again.evidence(p)["source"] for p in again} == {"cache"}
    assert again != plan  # the evidence says where the choices came from

    run = tmp_path / "run"
    argv = ["bench", *common, "--layouts", "NCHW", "--precisions", "mixed_bf16",
            "--batch-sizes", "2", "--modes", "infer", "--conv-algos", "xla,auto",
            "--repeats", "1", "--warmup", "0", "--no-plots", "--out", str(run)]  # fmt: skip
    assert _cli(argv) == 0
    captured = capsys.readouterr()
    assert f"{shapes} shapes ({shapes} cached)" in captured.err  # auto reused the tuning
    rows = load_results(run, source="csv").rows
    assert sorted(r["conv_algo"] for r in rows) == ["auto", "xla"]
    assert all(r["status"] == "ok" for r in rows)
    auto = next(r for r in rows if r["conv_algo"] == "auto")
    assert auto["conv_tune_s"] is not None and auto["conv_tune_s"] >= 0
    label = "auto+hwio+channels_last_inside +xla_backend_optimization_level +enable_fast_math"
    assert f"| {label} |" in captured.out


def test_conv_autotune_cli_algorithms_narrow_the_candidates(tmp_path, capsys):
    argv = ["autotune", "convs", "--model", "small_cnn", "--tiny", "--batch-size", "2",
            "--mode", "infer", "--repeats", "1", "--algorithms", "im2col, xla", "--json",
            "--cache", str(tmp_path / "convs.json")]  # fmt: skip
    assert _cli(argv) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert results
    for r in results:  # xla first, as in every tuning: the baseline a choice must beat
        assert [c["algorithm"] for c in r["candidates"]] == ["xla", "im2col"], r["spec_key"]
        assert r["choice"] in ("xla", "im2col")
        assert "|im2col,xla|" in r["cache_key"]  # another candidate set, another cache entry


def test_conv_autotune_cli_bad_input_is_a_clear_error(capsys):
    argv = ["autotune", "convs", "--model", "small_cnn", "--tiny", "--batch-size", "2",
            "--layout", "NWHC"]  # fmt: skip
    assert _cli(argv) == 2
    assert "NWHC" in capsys.readouterr().err
    tune = ["autotune", "convs", "--model", "small_cnn", "--tiny", "--batch-size", "2"]
    assert _cli([*tune, "--algorithms", "fft"]) == 2
    assert "Unknown conv algorithm 'fft'" in capsys.readouterr().err
    assert _cli([*tune, "--algorithms", ","]) == 2
    assert "names no algorithm" in capsys.readouterr().err
    argv = ["bench", "--model", "small_cnn", "--conv-algos", "fft", "--out", "unused"]
    assert _cli(argv) == 2
    assert "Unknown conv algorithm 'fft'" in capsys.readouterr().err


def test_cpu_fast_options_keep_reductions_off_the_slow_path():
    import jax
    import jax.numpy as jnp

    from layoutlab.bench.sweep import check_compile_options
    from layoutlab.xla import cpu_fast_options

    train = cpu_fast_options("train")
    assert check_compile_options(train) == train  # XLA accepts them
    # Compiled only, never run: the size of a ResNet-18 stage-1 activation at batch 128.
    x = jax.ShapeDtypeStruct((128, 32, 32, 64), jnp.float32)

    def variance(v):  # BatchNorm's statistic: a reduction over N, H, W
        return jnp.mean(jnp.square(v - jnp.mean(v, (0, 1, 2), keepdims=True)), (0, 1, 2))

    def hlo(options):
        return jax.jit(variance).lower(x).compile(compiler_options=options).as_text()

    # Convs on Eigen alone (dots only on YNNPACK) leaves reductions to XLA's reduce-window
    # splitting, which measured 10x slower on a BatchNorm-sized activation; the fast set
    # hands them to YNNPACK.
    assert "reduce-window" in hlo(EIGEN)
    assert "reduce-window" not in hlo(train)
    with pytest.raises(ValueError, match="mode must be one of"):
        cpu_fast_options("serve")


def test_cpu_fast_flag_merges_with_explicit_options():
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "bench",
            "--model",
            "small_cnn",
            "--out",
            "x",
            "--cpu-fast",
            "--xla-option",
            "xla_cpu_enable_fast_math=false",
        ]  # fmt: skip
    )
    from layoutlab.arguments import parse_assignments
    from layoutlab.bench.sweep_config import options_for
    from layoutlab.xla import cpu_fast_options

    fast_math_off = {"xla_cpu_enable_fast_math": False}
    config = SweepConfig(TrainConfig(xla_options=parse_assignments(args.xla_option, "x")))
    assert config.run.xla_options == fast_math_off  # the sweep adds the per-mode ones
    assert options_for(config, "infer", "cpu") == {**cpu_fast_options("infer"), **fast_math_off}
    assert args.cpu_fast


def test_cpu_fast_sweep_uses_each_modes_options():
    from layoutlab.xla import cpu_fast_options

    seen = []

    run = TrainConfig(
        model="small_cnn",
        model_kwargs=TINY,
        batch_size=2,
        cpu_fast=True,
        xla_options={"xla_cpu_enable_fast_math": False},
    )
    config = SweepConfig(run, {}, ("infer", "train"), repeats=1, warmup=0)
    run_sweep(config, jax_runner=_recorder(seen))
    by_mode = {c.workload.mode: dict(c.xla_options) for c in seen}
    for mode in ("infer", "train"):
        # A tiny model's step: its largest conv output is small (activation=1 stands for it).
        want = cpu_fast_options(mode, activation=1)
        assert by_mode[mode] == {**want, "xla_cpu_enable_fast_math": False}


def test_an_avx512_step_with_onednn_convs_leaves_elementwise_fusions_to_xla():
    # Around oneDNN's convs YNNPACK's elementwise fusions split a residual add and ReLU into
    # passes of their own and materialize broadcast constants: without them an SGD step ran
    # 1.03-1.08x faster on Zen 4 (benchmarks/results/eltwise_onednn_convs_zen4_cpu.md).
    from layoutlab import models
    from layoutlab.precision import get_policy
    from layoutlab.train.config import TrainConfig
    from layoutlab.train.fast_config import compile_options
    from layoutlab.xla import cpu_fast_options

    key = "xla_cpu_experimental_ynn_fusion_type"
    no_eltwise = "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE"
    large = 1 << 24
    sgd = cpu_fast_options("train", "pytorch", "avx512", 32, activation=large)
    assert sgd[key] != no_eltwise  # XLA's own convs keep them
    onednn = cpu_fast_options("train", "pytorch", "avx512", 32, activation=large, onednn_convs=True)
    assert onednn[key] == no_eltwise
    # Measured on AVX-512 only: AVX2 and inference keep theirs.
    avx2 = dict(kind="avx2", batch=32, activation=large)
    assert cpu_fast_options("train", "pytorch", onednn_convs=True, **avx2) == cpu_fast_options(
        "train", "pytorch", **avx2
    )
    assert cpu_fast_options("infer", kind="avx512", onednn_convs=True) == cpu_fast_options(
        "infer", kind="avx512"
    )
    # Wired through a run's precision and batch: the shipped table runs bfloat16 training
    # convs on oneDNN where the CPU has bfloat16 units, float32 ones on AVX-512 from batch 16,
    # where the extension loaded; an explicit conv algorithm is not the table's.
    f32, bf16 = get_policy("fp32").compute_dtype, get_policy("mixed_bf16").compute_dtype
    assert not models.table_runs_onednn(f32) and not models.table_runs_onednn(f32, 8)
    run = dict(model="resnet18", model_kwargs={"stem": "cifar"}, optimizer="sgd", batch_size=32)
    size = 32 * models.largest_conv_output("resnet18", {"stem": "cifar"}, (32, 32, 3))
    for precision in ("fp32", "mixed_bf16"):
        for algorithm in ("auto", "xla"):
            config = TrainConfig(**run, precision=precision, conv_algorithm=algorithm)
            got = compile_options(config, "train", input_shape=(32, 32, 3))
            dtype = f32 if precision == "fp32" else bf16
            on = algorithm == "auto" and models.table_runs_onednn(dtype, 32)
            want = cpu_fast_options("train", "sgd", batch=32, activation=size, onednn_convs=on)
            assert got == want, (precision, algorithm)


def test_train_options_follow_the_optimizer():
    # On AVX-512, YNNPACK's elementwise fusions slowed AdamW steps 1.2-1.4x and were within
    # 0.94-1.03x under SGD; on AVX2 even at batch 128
    # (benchmarks/results/cpu_fast_options_by_optimizer_avx512_cpu.md).
    from layoutlab import models
    from layoutlab.bench.sweep_config import options_for
    from layoutlab.train.config import TrainConfig
    from layoutlab.train.fast_config import compile_options
    from layoutlab.xla import cpu_fast_options

    key = "xla_cpu_experimental_ynn_fusion_type"
    with_eltwise = "LIBRARY_FUSION_TYPE_REDUCE,LIBRARY_FUSION_TYPE_ELTWISE"
    for kind in ("avx512", "avx2"):
        assert cpu_fast_options("train", kind=kind) == cpu_fast_options("train", "adamw", kind)
        for sgd in ("sgd", "momentum", "pytorch"):
            assert cpu_fast_options("train", sgd, kind)[key].endswith(with_eltwise)
        assert cpu_fast_options("infer", "momentum", kind) == cpu_fast_options("infer")
    no_eltwise = "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE"
    assert cpu_fast_options("train", "adam", "avx512")[key] == no_eltwise
    assert cpu_fast_options("train", "adamw", "avx2")[key].endswith(with_eltwise)
    # Wired through: a run's config (the main job's small_cnn on 8x8x1 digits, whose size
    # the next test's rule reads), and bench, whose --torch rows run SGD with momentum.
    for optimizer in ("adamw", "momentum"):
        config = TrainConfig(optimizer=optimizer)
        size = config.batch_size * models.largest_conv_output(config.model, {}, (8, 8, 1))
        got = compile_options(config, "train")
        assert got == cpu_fast_options("train", optimizer, activation=size)
    sweep = dict(model="small_cnn", model_kwargs=TINY, batch_size=2, cpu_fast=True)
    assert options_for(SweepConfig(config_for("pytorch", **sweep)), "train", "cpu") == (
        cpu_fast_options("train", "pytorch")
    )
    assert options_for(SweepConfig(TrainConfig(**sweep)), "train", "cpu") == cpu_fast_options(
        "train"
    )


def test_batch_one_training_on_avx512_runs_without_the_options():
    # On AVX-512 a batch-1 training step was 1.16x (SGD) and 1.05x (AdamW) faster on XLA's
    # own defaults; at batch 8 and 32 the options won
    # (benchmarks/results/cpu_fast_options_small_batch_avx512_cpu.md). AVX2 and inference
    # were not measured that way and keep them.
    from layoutlab.bench.sweep_config import options_for
    from layoutlab.train.config import TrainConfig
    from layoutlab.train.fast_config import compile_options
    from layoutlab.xla import cpu_fast_options

    for optimizer in ("pytorch", "adamw"):
        assert cpu_fast_options("train", optimizer, "avx512", batch=1) == {}
        assert cpu_fast_options("train", optimizer, "avx512", batch=8) == cpu_fast_options(
            "train", optimizer, "avx512"
        )
        assert cpu_fast_options("train", optimizer, "avx2", batch=1)
    assert cpu_fast_options("infer", kind="avx512", batch=1) == cpu_fast_options("infer")
    # Wired through with the batch the step runs at: a run's config, bench's groups (the
    # digits model and a tiny one: a small largest conv output, activation=1 stands for it).
    want = cpu_fast_options("train", "adamw", batch=1, activation=1)
    assert compile_options(TrainConfig(batch_size=1), "train") == want
    assert compile_options(TrainConfig(batch_size=1), "infer") == cpu_fast_options("infer")
    sweep = SweepConfig(TrainConfig(model="small_cnn", model_kwargs=TINY, batch_size=1))
    assert options_for(sweep, "train", "cpu", 1) == want


def test_depthwise_models_train_without_elementwise_fusions_on_avx512(monkeypatch):
    # MobileNetV2's SGD step ran 1.59-1.64x slower with YNNPACK's elementwise fusions at
    # batch 8 and 32 on AVX-512 (its depthwise convs' multiply-adds are split apart), while
    # ResNet-50's ran 1.57x faster with them
    # (benchmarks/results/cpu_fast_options_by_model_avx512_cpu.md). AVX2 was not measured.
    from layoutlab import models
    from layoutlab.bench.sweep_config import options_for
    from layoutlab.fast_defaults import fast_compile_options
    from layoutlab.train.config import TrainConfig
    from layoutlab.train.fast_config import compile_options
    from layoutlab.xla import cpu_fast_options

    key = "xla_cpu_experimental_ynn_fusion_type"
    no_eltwise = "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE"
    assert cpu_fast_options("train", "pytorch", "avx512", 8, depthwise=True)[key] == no_eltwise
    assert cpu_fast_options("train", "pytorch", "avx512", 8)[key] != no_eltwise
    assert cpu_fast_options("train", "pytorch", "avx2", 8, depthwise=True) == cpu_fast_options(
        "train", "pytorch", "avx2", 8
    )
    assert cpu_fast_options("infer", kind="avx512", depthwise=True) == cpu_fast_options(
        "infer", kind="avx512"
    )
    assert cpu_fast_options("train", "pytorch", "avx512", 1, depthwise=True) == {}
    # Which models have them: found by building the model abstractly.
    assert models.has_depthwise_convs("mobilenet_v2", {"width_mult": 0.25})
    assert not models.has_depthwise_convs("resnet18", {"stem": "cifar"})
    assert not models.has_depthwise_convs("unet")
    # Wired through a run's config and bench's sweeps, on this machine's CPU kind.
    mobilenet = dict(model="mobilenet_v2", model_kwargs={"width_mult": 0.25})
    largest = models.largest_conv_output(
        "mobilenet_v2", {"width_mult": 0.25}, models.spec("mobilenet_v2").default_input
    )
    want = fast_compile_options(
        "train", "cpu", "pytorch", 8, depthwise=True, activation=8 * largest
    )
    sweep = SweepConfig(config_for("pytorch", **mobilenet, batch_size=8), torch=True)
    assert options_for(sweep, "train", "cpu", 8) == want
    config = TrainConfig(**mobilenet, optimizer="momentum", batch_size=8)
    # The run's data (digits, 8x8) makes its largest conv output small as well.
    assert compile_options(config, "train") == fast_compile_options(
        "train", "cpu", "momentum", 8, depthwise=True, activation=1
    )
    monkeypatch.setattr("layoutlab.fast_defaults.cpu_kind", lambda: "avx512")
    assert options_for(sweep, "train", "cpu", 8)[key] == no_eltwise


def test_small_training_steps_run_without_elementwise_fusions(monkeypatch):
    # Below 2**20 elements in its largest conv output an SGD step left YNNPACK's elementwise
    # fusions out: U-Net 1.05-1.09x faster without them at batch 8 and 32, ResNet-18 CIFAR
    # even at 8; from 2**20 ResNet-18 (batch 16) and ResNet-50 (batch 2) ran 1.05x and 1.12x
    # faster with them (benchmarks/results/cpu_fast_options_by_model_avx512_cpu.md, round 7).
    from layoutlab import models
    from layoutlab.bench.sweep_config import options_for
    from layoutlab.fast_defaults import ELTWISE_MIN_ACTIVATION
    from layoutlab.xla import cpu_fast_options

    key = "xla_cpu_experimental_ynn_fusion_type"
    no_eltwise = "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE"
    small, large = ELTWISE_MIN_ACTIVATION - 1, ELTWISE_MIN_ACTIVATION
    assert cpu_fast_options("train", "pytorch", "avx512", 8, activation=small)[key] == no_eltwise
    for activation in (large, None):  # None: not known, as before the rule
        got = cpu_fast_options("train", "pytorch", "avx512", 8, activation=activation)
        assert got == cpu_fast_options("train", "pytorch", "avx512", 8)
        assert got[key] != no_eltwise
    # AVX2 too: ResNet-18 CIFAR 1.11x faster without them at batch 1 (65K elements), ResNet-50
    # 1.04x at 1 (0.8M) (benchmarks/results/train_table_small_batch_avx2_cpu.md); a CPU of
    # neither kind was not measured and keeps them. Inference keeps its options.
    assert cpu_fast_options("train", "pytorch", "avx2", 8, activation=small)[key] == no_eltwise
    assert cpu_fast_options("train", "pytorch", "avx2", 8, activation=large)[key] != no_eltwise
    assert cpu_fast_options("train", "pytorch", "other", 8, activation=small) == cpu_fast_options(
        "train", "pytorch", "other", 8
    )
    assert cpu_fast_options("infer", kind="avx512", activation=small) == cpu_fast_options(
        "infer", kind="avx512"
    )
    # The largest conv output of one example, from the architectures: U-Net's full-resolution
    # convs (width 16) and ResNet-50's ImageNet stem (112x112, 64 channels).
    assert models.largest_conv_output("unet", {}, (32, 32, 3)) == 32 * 32 * 16
    assert models.largest_conv_output("unet", {"width": 64}, (32, 32, 3)) == 32 * 32 * 64
    assert models.largest_conv_output("resnet50", {"stem": "imagenet"}, (224, 224, 3)) == (
        112 * 112 * 64
    )
    assert models.largest_conv_output("resnet18", {"stem": "cifar"}, (16, 16, 3)) == 16 * 16 * 64
    # A 3D model runs no 2D conv: nothing was measured there, so its options stay as they were.
    clip = models.spec("small_cnn3d").default_input
    assert models.largest_conv_output("small_cnn3d", {}, clip) is None
    assert models.model_compile_options(
        "small_cnn3d", {}, "train", "cpu", "pytorch", 8, clip
    ) == models.model_compile_options("small_cnn3d", {}, "train", "cpu", "pytorch", 8)
    # Wired through bench at the batch of each group, on an AVX-512 CPU: U-Net (16 * 32 * 32
    # per example) loses them at 8 and keeps them at 128; ResNet-18 CIFAR from 16.
    monkeypatch.setattr("layoutlab.fast_defaults.cpu_kind", lambda: "avx512")
    # On XLA's convs: around oneDNN's they go at every size (test_an_avx512_step_with_onednn_
    # convs_leaves_elementwise_fusions_to_xla).
    monkeypatch.setattr("layoutlab.models.registry.table_runs_onednn", lambda p, b=None: False)
    for model, kwargs, batch, eltwise in (("unet", {}, 8, False), ("unet", {}, 128, True),
                                          ("resnet18", {"stem": "cifar"}, 8, False),
                                          ("resnet18", {"stem": "cifar"}, 16, True)):  # fmt: skip
        run = config_for("pytorch", model=model, model_kwargs=kwargs, batch_size=batch)
        sweep = SweepConfig(run, torch=True)
        got = options_for(sweep, "train", "cpu", batch)[key]
        assert (got != no_eltwise) == eltwise, (model, batch, got)
    # And through a run's config, whose data source fixes the image size (nothing is loaded); a
    # folder's is known only once read, so there the rule does not apply.
    from layoutlab.train.config import TrainConfig
    from layoutlab.train.fast_config import compile_options

    run = dict(model="unet", optimizer="momentum", batch_size=8)
    got = compile_options(TrainConfig(**run, data="synthetic:32x32x3:10:64"), "train")
    assert got[key] == no_eltwise
    got = compile_options(TrainConfig(**run, data="folder:/no/such/dir"), "train")
    assert got[key] != no_eltwise
    # Sizes read without loading anything, and None for what they cannot tell.
    from layoutlab.data.source_forms import known_image_shape

    assert known_image_shape("digits") == (8, 8, 1)
    assert known_image_shape("synthetic:16x16x3:10:64") == (16, 16, 3)
    assert known_image_shape("synthetic") == (32, 32, 3)
    for bad in ("synthetic:16x16", "synthetic:0x8x3", "imagenet:/data", "folder:/d"):
        assert known_image_shape(bad) is None, bad
    assert models.example_shape("unet", 64) == (64, 64, 3)
    assert models.example_shape("unet", (48, 64)) == (48, 64, 3)
    assert models.example_shape("unet", (8, 8, 8)) is None  # three sizes for a 2D model
