"""Fast defaults (issue 20): what a run gets without speed flags, and each opt-out.

The defaults are read back from what the run recorded and compiled (config.json, the
inspect report's compile options and kernel layouts, bench rows), not from the code that
sets them. Numerics of ``winograd4_full`` are checked against float64 NumPy.
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from layoutlab import cli, fast_defaults, models, nn
from layoutlab.bench.tuning import budget
from layoutlab.bench.tuning.plan_source import conv_plan_for_run
from layoutlab.nn.conv_algos import conv2d
from layoutlab.nn.conv_algos.default_plan import DEFAULT_RULES, default_algorithm
from layoutlab.nn.conv_algos.geometry import make_spec, resolve_geometry
from layoutlab.nn.conv_config import conv_settings, set_kernel_storage
from layoutlab.train.config import TrainConfig
from layoutlab.train.loop import train_and_evaluate
from layoutlab.xla.flags import CPU_FAST_OPTIONS
from layoutlab.xla.host_memory import ENV_SETTING_PER_THREAD

_YNN = "xla_cpu_experimental_ynn_fusion_type"
_TINY = ["--model", "small_cnn", "--model-arg", "width=4", "--model-arg", "hidden=8"]

# The CLI's default run and the Python API's run the same tiny NCHW model at batch 16 for 2
# steps: the second reads the first's train, eval and init programs back (~6 s of CPU).
pytestmark = pytest.mark.usefixtures("shared_compiles")


def test_default_train_run_records_the_fast_configuration(tmp_path, capsys):
    workdir = tmp_path / "run"
    argv = ["train", *_TINY, "--steps", "2", "--batch-size", "16", "--layout", "NCHW",
            "--workdir", str(workdir), "--quiet"]  # fmt: skip
    assert cli.main(argv) == 0
    assert "conv plan: shipped table" in capsys.readouterr().out
    config = json.loads((workdir / "config.json").read_text())
    assert config["cpu_fast"] is True
    assert config["kernel_storage"] == "channels_last"  # resolved on CPU, stored resolved
    assert config["activation_storage"] == "channels_last"
    assert config["conv_algorithm"] == "auto"
    entries = config["conv_plan"]["convs"]
    sources = {e["evidence"]["source"] for e in entries.values()}
    assert entries and all(s.startswith("default table") for s in sources), sources


@pytest.mark.parametrize(
    ("flags", "field", "value"),
    [
        (["--no-cpu-fast"], "cpu_fast", False),
        (["--kernel-storage", "layout"], "kernel_storage", "layout"),
        (["--activation-storage", "layout"], "activation_storage", "layout"),
        (["--conv-algo", "xla"], "conv_algorithm", "xla"),
    ],
)
def test_each_opt_out_turns_off_its_part_only(tmp_path, flags, field, value):
    from layoutlab.train.command import build_config
    from layoutlab.train.config import validate

    argv = ["train", *_TINY, "--workdir", str(tmp_path), *flags]
    config = validate(build_config(cli.build_parser().parse_args(argv))[0], 1)
    fast = {"cpu_fast": True, "kernel_storage": "channels_last", "conv_algorithm": "auto",
            "activation_storage": "channels_last"}  # fmt: skip
    assert {k: getattr(config, k) for k in fast} == {**fast, field: value}


def test_python_api_gets_the_same_defaults(tmp_path):
    config = TrainConfig(model="small_cnn", model_kwargs={"width": 4, "hidden": 8}, layout="NCHW",
                         num_steps=2, batch_size=16, log_every=0, tensorboard=False)  # fmt: skip
    train_and_evaluate(config, tmp_path / "api", quiet=True)
    saved = json.loads((tmp_path / "api" / "config.json").read_text())
    assert saved["kernel_storage"] == "channels_last" and saved["conv_plan"] is not None
    # A config saved before these defaults existed keeps what it ran with.
    old = {k: v for k, v in saved.items() if k not in ("conv_algorithm", "kernel_storage",
                                                       "activation_storage",
                                                       "cpu_fast")}  # fmt: skip
    legacy = TrainConfig.from_dict(old)
    got = (legacy.conv_algorithm, legacy.kernel_storage, legacy.activation_storage, legacy.cpu_fast)
    assert got == ("xla", "layout", "layout", False)


def test_inspect_reads_back_options_and_kernel_layout_of_a_default_train_step(capsys):
    # The tiny small_cnn at 16x16: big enough that YNNPACK takes its BatchNorm reductions
    # (at its 8x8 default input they are too small for it, with or without the options),
    # still a small largest conv output (4 x 16 x 16 x 4) for the options' rule below.
    def report(*flags):
        argv = ["inspect", "--model", "small_cnn", "--tiny", "--image-size", "16", "--layout",
                "NCHW", "--mode", "train", "--batch-size", "4", "--json", "-", *flags]  # fmt: skip
        assert cli.main(argv) == 0
        return json.loads(capsys.readouterr().out)

    fast = report()
    # The options of a step whose largest conv output is small (the tiny model at batch 4).
    small = fast_defaults.fast_compile_options("train", activation=1)
    assert fast["flags"]["compiler_options"] == small
    assert _YNN in fast["flags"]["compiler_options"]
    assert fast["kernel_storage"] == "channels_last" and fast["conv_algorithm"] == "auto"
    assert fast["conv_plan"]  # the shipped table's choices, one per conv
    assert fast["activation_storage"] == "channels_last"
    plain = report("--no-cpu-fast", "--kernel-storage", "layout", "--conv-algo", "xla",
                   "--activation-storage", "layout")  # fmt: skip
    assert plain["flags"]["compiler_options"] == {}
    # OIHW kernels in NCHW are transposed on every call; HWIO ones are not (the training
    # step's remaining kernel-shaped transposes belong to the weight gradients).
    assert plain["totals"]["kernel_transposes"] > fast["totals"]["kernel_transposes"]
    assert plain["kernel_storage"] == "layout" and plain["conv_algorithm"] == "xla"
    assert plain["activation_storage"] == "layout"

    # Read back from the compiled program itself: the convs XLA compiled. By default the NCHW
    # model's layers compute in NHWC with HWIO kernels: no conv of the program is NCHW.
    def logical(rep):
        return {c["logical"] for c in rep["convolutions"]}

    assert "NHWC*HWIO->NHWC" in logical(fast) and not any("NCHW" in s for s in logical(fast))
    # Each opt-out alone: HWIO kernels in an NCHW program, and OIHW ones in plain XLA. The
    # forward convs say it, so the NCHW program is a forward (its training step's forward
    # convs are the same, and a training step compiles about 5x slower).
    nchw = report("--activation-storage", "layout", "--mode", "infer")
    nchw_fwd = {s for s in logical(nchw) if s.startswith("NCHW*")}
    assert "NCHW*HWIO->NCHW" in nchw_fwd and not any("OIHW" in s for s in nchw_fwd)
    plain_fwd = {s for s in logical(plain) if s.startswith("NCHW*")}
    assert "NCHW*OIHW->NCHW" in plain_fwd and not any("HWIO" in s for s in plain_fwd)
    # The options: YNNPACK takes the BatchNorm reductions of a training step, which it does
    # not when given only the dots; every other setting is the same on both sides.
    ynn = "kCustom(__ynn_fusion)"
    with_options = fast["fusion_kinds"].get(ynn, 0)
    dots = f"{_YNN}=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"
    dots_only = report("--xla-option", dots)["fusion_kinds"].get(ynn, 0)
    assert with_options > dots_only


def test_unknown_fast_option_is_left_out_with_one_notice(monkeypatch, capsys):
    monkeypatch.setitem(CPU_FAST_OPTIONS, "train", {"xla_cpu_no_such_option_issue20": True,
                                                    **CPU_FAST_OPTIONS["train"]})  # fmt: skip
    got = fast_defaults.fast_compile_options("train", "cpu")
    assert "xla_cpu_no_such_option_issue20" not in got and _YNN in got
    again = fast_defaults.fast_compile_options("train", "cpu")  # probed once per process
    assert again == got
    notes = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(notes) == 1 and notes[0].startswith("note: ") and "no_such_option" in notes[0]
    assert fast_defaults.fast_compile_options("train", "gpu") == {}  # never CPU options on GPU
    assert fast_defaults.default_kernel_storage("gpu") == "layout"
    assert fast_defaults.default_activation_storage("gpu") == "layout"


def _spec(n, size, cin, cout, k=3, stride=1, dtype="float32", groups=1):
    pad = "SAME"
    geom = resolve_geometry((size, size), k, stride, pad, groups=groups)
    return make_spec((n, size, size, cin), cout, geom, dtype=dtype, layout="NHWC")


def test_depthwise_convs_take_the_shifted_multiply_adds_on_x86():
    # MobileNetV2's 3x3 depthwise convs, both strides, at every batch and in both
    # objectives: the whole step 2.2-9.1x faster at batch 1-128
    # (benchmarks/results/depthwise_avx512_cpu.md), on AVX2 3.4-7.1x at batch 8
    # (train_table_small_batch_avx2_cpu.md). Float32 only; a CPU of neither kind keeps XLA's.
    for stride in (1, 2):
        for batch in (1, 8, 32, 128):
            spec = _spec(batch, 16, 144, 144, stride=stride, groups=144)
            for objective in ("train", "inference"):
                for kind in ("avx512", "avx2"):
                    assert default_algorithm(spec, objective, kind)[0] == "depthwise"
                assert default_algorithm(spec, objective, "other")[0] == "xla"
            assert default_algorithm(spec._replace(dtype="bfloat16"), "train", "avx512")[0] == "xla"
    # Grouped but not depthwise, and a channel multiplier of 2: XLA's conv.
    assert default_algorithm(_spec(8, 16, 144, 144, groups=2), "train", "avx512")[0] == "xla"
    assert default_algorithm(_spec(8, 16, 72, 144, groups=72), "train", "avx512")[0] == "xla"
    # The depthwise rules never take an ungrouped conv: ResNet-18's 32x32x64 one keeps XLA's.
    assert default_algorithm(_spec(128, 32, 64, 64), "train", "avx512")[0] == "xla"


def test_shipped_table_follows_its_measurements():
    assert default_algorithm(_spec(128, 16, 128, 128), "train", "avx512")[0] == "winograd4_full"
    assert default_algorithm(_spec(128, 16, 128, 128), "train", "avx2")[0] == "winograd4_xla_dw"
    assert default_algorithm(_spec(128, 32, 64, 64), "train", "avx512")[0] == "xla"
    assert (
        default_algorithm(_spec(128, 32, 64, 128, k=1, stride=2), "train", "avx512")[0] == "im2col"
    )
    # The stem rule covers the measured 32x32x3 stem with 64 out-channels (ResNet-18,
    # VGG-11), not the digits job's 8x8x1 one nor U-Net's 16-channel one (7% slower at 32).
    for objective in ("train", "inference"):
        assert default_algorithm(_spec(128, 32, 3, 64), objective, "avx512")[0] == "im2col"
        for batch in (1, 8, 32):
            assert default_algorithm(_spec(batch, 32, 3, 16), objective, "avx512")[0] == "xla"
    assert default_algorithm(_spec(32, 8, 1, 32), "train", "avx512")[0] == "xla"
    # Winograd F(4x4) refuses bfloat16 and nothing was measured there; GPU has no rules.
    assert (
        default_algorithm(_spec(128, 16, 128, 128, dtype="bfloat16"), "train", "avx512")[0] == "xla"
    )
    assert default_algorithm(_spec(128, 16, 128, 128), "train", None)[0] == "xla"


def test_shipped_table_rules_depend_on_the_batch():
    """A conv shape measured at batch 128 is another amount of work at batch 1: a rule
    only applies within the batch sizes it was measured to win at."""
    # ResNet-18 CIFAR's 16x16x128 3x3 conv: Winograd at batch 128 (the measurement behind
    # the rule), XLA's conv at batch 1 and 8 on both CPU kinds in inference and on AVX-512
    # in training.
    for kind, algorithm in (("avx2", "winograd4_xla_dw"), ("avx512", "winograd4_full")):
        for objective in ("train", "inference"):
            assert default_algorithm(_spec(128, 16, 128, 128), objective, kind)[0] == algorithm
            for batch in (1, 8):
                got = default_algorithm(_spec(batch, 16, 128, 128), objective, kind)
                if (kind, objective) != ("avx2", "train"):
                    assert got[0] == "xla", (kind, objective, batch, got)
    # AVX2 training: all three Winograd on the 32x32x64 and 16x16x128 stage convs up to batch
    # 32 (the whole ResNet-18 step 1.04-1.15x faster at 1, 8 and 32), XLA's conv between the
    # measured 32 and 128, the batch-128 rule's Winograd from 128; the 32x32x64 conv at 128
    # (where the autotuner found XLA's conv fastest) keeps XLA's.
    for size, channels in ((16, 128), (32, 64)):
        by_batch = [default_algorithm(_spec(b, size, channels, channels), "train", "avx2")[0]
                    for b in (1, 8, 32, 33, 128)]  # fmt: skip
        last = "winograd4_xla_dw" if size == 16 else "xla"
        assert by_batch == ["winograd4_full"] * 3 + ["xla", last], (size, by_batch)
    # And ResNet-18's layer4 at batch 1 and 8: im2col, where XLA's input-gradient conv spent
    # 15-18 ms a step transposing each 512-channel kernel (2.1x one by one); XLA's conv at
    # 32, where the AVX-512 bound lost the step 0.97x; Winograd from 128.
    layer4 = _spec(1, 4, 512, 512)
    by_batch = [default_algorithm(layer4._replace(batch=b), "train", "avx2")[0]
                for b in (1, 8, 9, 32, 128)]  # fmt: skip
    assert by_batch == ["im2col", "im2col", "xla", "xla", "winograd4_xla_dw"]
    # ResNet-18's 8x8x256 convs at batch 1: im2col's GEMM weight gradient (gemm_dw), the
    # step 1.03x faster; on ResNet-50's 14x14 ones at 1 (even), XLA's conv. From batch 8 to
    # 127 all three Winograd on those and ResNet-50's 7x7x512 ones (ResNet-50's step 1.05x
    # at 16 and 32, ResNet-18's 1.03-1.13x at 8-64, 1.29x at 96 with the batch-128 rule
    # from 65 on its other convs); from 128 the batch-128 rule's Winograd.
    for size, channels, first in ((8, 256, "gemm_dw"), (14, 256, "xla"), (7, 512, "im2col")):
        by_batch = [default_algorithm(_spec(b, size, channels, channels), "train", "avx2")[0]
                    for b in (1, 7, 8, 64, 96, 127, 128)]  # fmt: skip
        assert by_batch == [first, "xla", "winograd4_full", "winograd4_full", "winograd4_full",
                            "winograd4_full", "winograd4_xla_dw"], (size, by_batch)  # fmt: skip
    # The batch-128 rule reaches down to 65 on ResNet-18's 16x16x128 and 4x4x512 convs (the
    # 1.29x at 96 above); between the stage rule's 32 and 65, XLA's conv (unmeasured).
    for size, channels in ((16, 128), (4, 512)):
        by_batch = [default_algorithm(_spec(b, size, channels, channels), "train", "avx2")[0]
                    for b in (33, 64, 65, 96, 128)]  # fmt: skip
        assert by_batch == ["xla", "xla", "winograd4_xla_dw", "winograd4_xla_dw",
                            "winograd4_xla_dw"], (size, by_batch)  # fmt: skip
    # On AVX2 the inference rule starts at batch 16 on 7x7 to 28x28 inputs (ResNet-50's step
    # 1.09x faster at 16), 128 on 4x4.
    for size, channels in ((7, 512), (8, 256), (14, 256), (28, 128)):
        by_batch = [default_algorithm(_spec(b, size, channels, channels), "inference", "avx2")[0]
                    for b in (8, 15, 16, 32)]  # fmt: skip
        assert by_batch == ["xla", "xla", "winograd4_xla_dw", "winograd4_xla_dw"], by_batch
    assert default_algorithm(_spec(32, 4, 512, 512), "inference", "avx2")[0] == "xla"
    assert default_algorithm(_spec(16, 32, 128, 128), "inference", "avx2")[0] == "xla"
    assert default_algorithm(_spec(128, 4, 512, 512), "inference", "avx2")[0] != "xla"
    # On AVX-512 ResNet-18 CIFAR's layer4 convs change hands with the batch in training:
    # im2col up to 32 (at 1 and 8 Winograd ran 2-3x slower than XLA's conv; at 32 im2col
    # made the whole step 1.02x faster than Winograd, at 16 a tie); Winograd from 64. The
    # stride-2 one: im2col up to 32; at 128 its input gradient by stride phases (phase_dx).
    layer4, down = _spec(1, 4, 512, 512), _spec(1, 8, 256, 512, stride=2)
    by_batch = [default_algorithm(layer4._replace(batch=b), "train", "avx512")[0]
                for b in (1, 8, 16, 32, 33, 128)]  # fmt: skip
    assert by_batch == ["im2col", "im2col", "im2col", "im2col", "winograd4_full",
                        "winograd4_full"]  # fmt: skip
    by_batch = [default_algorithm(down._replace(batch=b), "train", "avx512")[0]
                for b in (1, 32, 128)]  # fmt: skip
    assert by_batch == ["im2col", "im2col", "phase_dx"]
    assert default_algorithm(layer4, "inference", "avx512")[0] == "xla"
    # In inference Winograd takes the 4x4 ones from 128: the whole ResNet-18 step ran 0.92x
    # at 32 and 0.98x at 64 with it, 1.03x at 128. The 7x7-28x28 rule gives the 8x8 and
    # 16x16 convs Winograd from 32 (at 16 the step ran 0.88x with it, at 32 1.04x).
    by_batch = [default_algorithm(layer4._replace(batch=b), "inference", "avx512")[0]
                for b in (32, 64, 127, 128, 256)]  # fmt: skip
    assert by_batch == ["xla", "xla", "xla", "winograd4_full", "winograd4_full"]
    for size in (7, 8, 16, 28):
        by_batch = [default_algorithm(_spec(b, size, 256, 256), "inference", "avx512")[0]
                    for b in (16, 31, 32)]  # fmt: skip
        assert by_batch == ["xla", "xla", "winograd4_full"], size
    # ResNet-50's 1x1 stride-1 convs (64+ channels): im2col at batch 1 in training, where the
    # whole step gained 1.23x; at 16 it lost 2% though each conv alone won.
    bottleneck = _spec(1, 14, 1024, 256, k=1)
    assert default_algorithm(bottleneck, "train", "avx512")[0] == "im2col"
    assert default_algorithm(bottleneck._replace(batch=16), "train", "avx512")[0] == "xla"
    assert default_algorithm(bottleneck, "inference", "avx512")[0] == "xla"
    # ResNet-50's 7x7x512 3x3 conv and its 14x14/28x28 stride-2 3x3 convs: im2col at batch 1
    # in training (the whole step 1.05x and 1.04x); from batch 2 XLA's conv, or for the
    # stride-2 one its input gradient by stride phases; XLA's conv in inference.
    for spec, after in (
        (_spec(1, 7, 512, 512), "xla"),
        (_spec(1, 28, 256, 256, stride=2), "phase_dx"),
    ):
        assert default_algorithm(spec, "train", "avx512")[0] == "im2col"
        assert default_algorithm(spec._replace(batch=2), "train", "avx512")[0] == after
        assert default_algorithm(spec, "inference", "avx512")[0] == "xla"
    # A stride-2 3x3 conv's input gradient by stride phases, at every batch, in training on
    # AVX-512 (1.1-1.8x each, batch 1-128), where no im2col rule took the conv first.
    strided = _spec(16, 56, 128, 128, stride=2)
    for batch in (1, 16, 128):
        assert default_algorithm(strided._replace(batch=batch), "train", "avx512")[0] == "phase_dx"
    # On AVX2 up to batch 32, the batches measured (even on ResNet-18, 1.02x on ResNet-50).
    assert default_algorithm(strided, "train", "avx2")[0] == "phase_dx"
    assert default_algorithm(strided._replace(batch=33), "train", "avx2")[0] == "xla"
    assert default_algorithm(strided, "inference", "avx512")[0] == "xla"
    assert default_algorithm(_spec(1, 28, 256, 256, stride=2), "train", "avx512")[0] == "im2col"
    # A 3x3 conv on an input smaller than its kernel, which XLA rewrites into a 5-100x slower
    # conv, runs im2col at every batch on both CPU kinds; a 3x3 input does not (at batch 64,
    # above the AVX-512 training rule that gives 4x4-and-smaller 512-channel convs im2col).
    for kind in ("avx2", "avx512"):
        for objective in ("train", "inference"):
            for batch, size, stride in ((1, 2, 1), (128, 2, 1), (16, 1, 1), (16, 2, 2)):
                spec = _spec(batch, size, 512, 512, stride=stride)
                assert default_algorithm(spec, objective, kind)[0] == "im2col"
            assert default_algorithm(_spec(64, 3, 512, 512), objective, kind)[0] != "im2col"
    # Every bounded rule of every table: the shape at its smallest batch gets the rule, the
    # same shape one below it does not.
    for (kind, objective, dtype), rules in DEFAULT_RULES.items():
        for rule in rules:
            size = max(rule.min_size, min(rule.max_size or 16, 16))
            k = rule.kernel[0]
            cin = max(rule.min_in, min(rule.max_in or 128, 128))
            # A depthwise rule's class: one group per channel, as many out as in.
            cout, groups = (cin, cin) if rule.depthwise else (64, 1)
            spec = _spec(rule.min_batch, size, cin, cout, k=k, stride=rule.strides[0],
                         dtype=dtype, groups=groups)  # fmt: skip
            assert rule.matches(spec), (kind, objective, rule)
            if rule.min_batch > 1:
                assert not rule.matches(spec._replace(batch=rule.min_batch - 1))
            if rule.max_batch is not None:
                assert not rule.matches(spec._replace(batch=rule.max_batch + 1))


def test_default_conv_plan_follows_the_batch_it_is_traced_at():
    """The plan a run gets from the table is per batch: the same model traced at batch 1
    gets XLA's conv where at batch 128 it gets Winograd (an AVX2 inference step), and its
    entries name the batch."""
    import jax

    from layoutlab.nn.conv_config import default_conv_plan

    class Two(nnx.Module):
        def __init__(self):
            self.conv = nn.Conv(128, 128, 3, algorithm="auto", rngs=nnx.Rngs(0))

        def __call__(self, x):
            return self.conv(x)

    model = Two()
    plans = {
        n: default_conv_plan(
            model, jax.ShapeDtypeStruct((n, 16, 16, 128), "float32"), "inference", "avx2"
        )  # fmt: skip
        for n in (1, 128)
    }
    assert plans[128]["conv"].algorithm == "winograd4_xla_dw"
    assert plans[1]["conv"].algorithm == "xla"
    assert ":n1:" in plans[1]["conv"].spec_key and ":n128:" in plans[128]["conv"].spec_key


def test_winograd4_full_matches_float64_numpy():
    """Forward, input and weight gradient against a float64 direct conv. The bar is F(4x4,
    3x3)'s measured error in float32 (docs/guides/conv-algorithms.md: 4e-6-1.6e-5 of max|ref|
    on ResNet shapes), with headroom for the 3x3 weight gradient's longer sums: 5e-5 of
    max|ref|."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 9, 7, 5))
    w = rng.standard_normal((3, 3, 5, 6))
    dy = rng.standard_normal((2, 9, 7, 6))

    def run(xx, ww):
        return conv2d(xx, ww, algorithm="winograd4_full", strides=(1, 1),
                      padding=((1, 1), (1, 1)), layout="NHWC", kernel_layout="HWIO")  # fmt: skip

    # Under jit, as in a training step (op by op, each of the transforms' many small ops
    # would compile on its own).
    @jax.jit
    def train(xx, ww, gg):
        y, vjp = jax.vjp(run, xx, ww)
        return y, *vjp(gg)

    y, dx, dw = train(*(jnp.asarray(a, jnp.float32) for a in (x, w, dy)))
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    ref_y = sum(np.einsum("nhwc,co->nhwo", xp[:, i:i + 9, j:j + 7], w[i, j])
                for i in range(3) for j in range(3))  # fmt: skip
    ref_dw = np.stack([np.einsum("nhwc,nhwo->co", xp[:, i:i + 9, j:j + 7], dy)
                       for i in range(3) for j in range(3)]).reshape(w.shape)  # fmt: skip
    gp = np.pad(dy, ((0, 0), (1, 1), (1, 1), (0, 0)))
    ref_dx = sum(np.einsum("nhwo,co->nhwc", gp[:, 2 - i:11 - i, 2 - j:9 - j], w[i, j])
                 for i in range(3) for j in range(3))  # fmt: skip
    for got, ref in ((y, ref_y), (dx, ref_dx), (dw, ref_dw)):
        err = np.abs(np.asarray(got, np.float64) - ref).max() / np.abs(ref).max()
        assert err < 5e-5, err


def test_torch_round_trip_and_convert_layout_are_exact_with_hwio_kernels():
    from layoutlab.compare.torch_weights import load_torch_state_dict, to_torch_state_dict
    from layoutlab.nn.convert import convert_layout

    pytest.importorskip("torch")
    kw = dict(width=4, hidden=8)
    model = models.create("small_cnn", layout="NCHW", rngs=nnx.Rngs(1), **kw)
    set_kernel_storage(model, fast_defaults.default_kernel_storage("cpu"))
    assert {spec for _, spec in conv_settings(model).values()} == {"HWIO"}
    state = to_torch_state_dict(model)
    other = models.create("small_cnn", layout="NCHW", rngs=nnx.Rngs(2), **kw)
    set_kernel_storage(other, "channels_last")
    load_torch_state_dict(other, state)
    model.eval(), other.eval()  # no dropout: their rngs differ
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 1, 8, 8)), jnp.float32)

    # One program per model structure rather than one compile per op: model and other
    # share theirs (their weights are its arguments).
    forward = nnx.jit(lambda m, inputs: m(inputs))
    want = np.asarray(forward(model, x))
    np.testing.assert_array_equal(np.asarray(forward(other, x)), want)  # same weights
    nhwc = convert_layout(model, "NHWC")
    nhwc.eval()
    # The other layout: equal up to float32 reassociation of the same sums (1e-5).
    got = np.asarray(forward(nhwc, jnp.moveaxis(x, 1, -1)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_tuning_is_skipped_when_it_cannot_pay_and_the_cache_is_used_when_full(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("LAYOUTLAB_AUTOTUNE_CACHE", str(tmp_path / "cache.json"))
    # One 1x1 conv: which plan source is taken depends neither on how many shapes there are
    # nor on their kind, and tuning compiles every candidate per shape (small_cnn's three
    # 3x3 convs took 3x as long; a 3x3 conv has 10 training candidates, a 1x1 one 6).
    model = nnx.eval_shape(lambda: nn.Conv(1, 4, 1, rngs=nnx.Rngs(0)))
    x = jax.ShapeDtypeStruct((8, 8, 8, 1), jnp.float32)
    short = conv_plan_for_run(model, x, steps=10)
    assert short.source == "table" and "too short" in short.detail
    tuned = conv_plan_for_run(model, x, steps=10, tune="always", repeats=1, warmup=0)
    assert tuned.source == "tuned"
    cached = conv_plan_for_run(model, x, steps=10)  # every shape cached now: free
    assert cached.source == "cache" and cached.plan.algorithms() == tuned.plan.algorithms()
    assert conv_plan_for_run(model, x, steps=10, tune="never").source == "table"


def test_budget_estimate_pays_only_for_long_runs():
    spec = _spec(32, 16, 32, 32)
    specs = {"a": spec}
    one = lambda s: 4  # noqa: E731
    assert budget.cannot_pay(specs, 5, "cpu", one, 7)
    long = budget.estimate_tuning(specs, 10**7, n_candidates=one, rounds=7)
    short = budget.estimate_tuning(specs, 10, n_candidates=one, rounds=7)
    assert long.pays and not short.pays and short.tune_s == pytest.approx(long.tune_s, rel=1)


def test_default_keep_host_memory_applies_before_jax_starts(tmp_path):
    """In a fresh process the CLI's default keeps host memory with one malloc arena for big
    batches and with per-thread arenas for small ones (the digits job's 32 x 8 x 8);
    ``--no-keep-host-memory`` leaves glibc alone. The bench then fails on its unknown model,
    after the setting and before any compile."""
    code = (
        "import sys; from layoutlab import cli; from layoutlab.xla import host_memory_state;"
        "assert cli.main(sys.argv[1:]) == 2; print(host_memory_state().how)"
    )

    def kept(*flags, tunables=None):
        argv = ["bench", "--model", "no_such_model", "--out", str(tmp_path), *flags]
        env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
        if tunables:
            env["GLIBC_TUNABLES"] = tunables
        out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                             text=True, timeout=300, check=True, env=env).stdout  # fmt: skip
        return out.strip().splitlines()[-1]

    big = ("--image-size", "32", "--batch-sizes", "128")
    assert kept(*big) == "mallopt"
    assert kept(*big, "--no-keep-host-memory") == "default glibc malloc"
    assert kept("--image-size", "8", "--batch-sizes", "32") == "mallopt (per-thread arenas)"
    # The host-memory guide's way to per-thread arenas at any batch, from the command line.
    per_thread = ENV_SETTING_PER_THREAD.split("=", 1)[1]
    assert kept(*big, tunables=per_thread) == "environment (per-thread arenas)"


def test_bench_rows_say_which_defaults_ran_and_baseline_plain_adds_plain_rows(
    tmp_path, monkeypatch, capsys
):
    from layoutlab.bench.results import load_results

    monkeypatch.setenv("LAYOUTLAB_AUTOTUNE_CACHE", str(tmp_path / "cache.json"))
    # Forward steps only: the labels depend on neither mode nor layout, and a forward
    # compiles about 5x faster than a training step. Each mode's own options in the cases
    # a sweep runs: test_bench_conv_options.py::test_cpu_fast_sweep_uses_each_modes_options.
    common = ["bench", *_TINY, "--precisions", "fp32",
              "--batch-sizes", "2", "--modes", "infer", "--repeats", "1", "--warmup", "0",
              "--no-plots", "--no-roofline"]  # fmt: skip
    argv = [*common, "--layouts", "NHWC,NCHW", "--baseline-plain", "--out", str(tmp_path / "a")]
    assert cli.main(argv) == 0
    rows = load_results(tmp_path / "a", source="csv").rows
    keys = ("layout", "defaults", "conv_algo", "kernel_storage", "activation_storage")
    got = sorted(tuple(r[k] for k in keys) for r in rows)
    assert got == [
        ("NCHW", "fast", "auto", "channels_last", "channels_last"),
        ("NCHW", "plain", "xla", "layout", "layout"),
        ("NHWC", "fast", "auto", "channels_last", "channels_last"),
        ("NHWC", "plain", "xla", "layout", "layout"),
    ]
    fast = [r for r in rows if r["defaults"] == "fast"]
    plain = [r for r in rows if r["defaults"] == "plain"]
    assert all(r["conv_plan_source"] == "table" for r in fast)  # empty cache, short run
    assert all(_YNN in json.loads(r["xla_options"]) for r in fast)
    assert all(json.loads(r["xla_options"]) == {} and not r["conv_plan_source"] for r in plain)
    assert "| plain XLA |" in capsys.readouterr().out
    # An opt-out flag makes the rows "custom": they are no longer the defaults (one layout:
    # the label does not depend on it).
    argv = [*common, "--layouts", "NCHW", "--no-cpu-fast", "--out", str(tmp_path / "b")]
    assert cli.main(argv) == 0
    rows = load_results(tmp_path / "b", source="csv").rows
    assert len(rows) == 1 and {r["defaults"] for r in rows} == {"custom"}
    assert all(json.loads(r["xla_options"]) == {} for r in rows)
