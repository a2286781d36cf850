"""The shipped conv table (issue 20's ``conv_algorithm="auto"`` default): which algorithm
each rule gives a conv shape, at which batches and on which CPU kind, the per-batch plan a
model gets from it, when tuning replaces it, and the numerics of ``winograd4_full`` against
float64 NumPy.

Split from ``test_fast_defaults.py``, which reads the defaults back from what a run records
and compiles.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from onednn_helpers import simulate_no_onednn

from layoutlab import nn
from layoutlab.bench.tuning import budget
from layoutlab.bench.tuning.plan_source import conv_plan_for_run
from layoutlab.nn.conv_algos import conv2d, onednn
from layoutlab.nn.conv_algos.default_plan import (
    DEFAULT_RULES,
    default_algorithm,
)
from layoutlab.nn.conv_algos.geometry import make_spec, resolve_geometry


def _spec(n, size, cin, cout, k=3, stride=1, dtype="float32", groups=1):
    pad = "SAME"
    geom = resolve_geometry((size, size), k, stride, pad, groups=groups)
    return make_spec((n, size, size, cin), cout, geom, dtype=dtype, layout="NHWC")


@pytest.fixture(autouse=True)
def _without_onednn(request, monkeypatch):
    """The table's rules for XLA compositions, read where the oneDNN extension is absent:
    where it loaded, its rules take some of the same convs first (the test marked
    ``with_onednn`` below, and tests/nn/test_conv_table_bf16.py)."""
    if "with_onednn" not in request.keywords:
        simulate_no_onednn(monkeypatch)


@pytest.mark.with_onednn
@pytest.mark.skipif(not onednn.available(), reason="the onednn extension did not load")
def test_float32_small_batch_inference_and_larger_batch_training_run_onednn_on_avx512():
    # ResNet-18 CIFAR's inference step 1.19x faster at batch 1 and 1.06x at 8 with oneDNN's
    # float32 convs, ResNet-50's 1.03x and 1.08x (onednn_defaults_resnet18_zen4_cpu_2.md);
    # 1.07-1.17x at 16 and 32 but Winograd's 0.92-0.95x at 128 and 256
    # (onednn_fp32_inference_by_batch_zen4_cpu.md).
    convs = [_spec(1, 32, 3, 64), _spec(1, 32, 64, 64), _spec(1, 16, 128, 256, stride=2),
             _spec(1, 32, 64, 128, k=1, stride=2), _spec(1, 14, 1024, 256, k=1),
             _spec(1, 4, 512, 512), _spec(1, 224, 3, 64, k=7, stride=2)]  # fmt: skip
    for spec in convs:
        # float32 reads the AVX-512 rules on both kinds; the 4x4 512-channel conv runs XLA's
        # on the kind without bf16 units (test_an_ice_lake_runs_xla_on_4x4_512_channel_convs).
        for kind in ("avx512", "avx512_bf16") if spec.in_size != (4, 4) else ("avx512_bf16",):
            for batch in (1, 8, 16, 32):
                got = default_algorithm(spec._replace(batch=batch), "inference", kind)
                assert got[0] == "onednn", (spec, batch, got)
            assert default_algorithm(spec._replace(batch=33), "inference", kind)[0] != "onednn"
            assert default_algorithm(spec, "train", kind)[0] != "onednn"
            # Training from batch 16: ResNet-50 1.56x at 16, ResNet-18 CIFAR 1.12-1.17x at
            # 32-256, but 0.95x at 8 (onednn_defaults_resnet18_zen4_cpu_3.md).
            for batch in (16, 32, 128, 256):
                got = default_algorithm(spec._replace(batch=batch), "train", kind)
                assert got[0] == "onednn", (spec, batch, got)
            assert default_algorithm(spec._replace(batch=8), "train", kind)[0] != "onednn"
        assert default_algorithm(spec, "inference", "avx2")[0] != "onednn"
    # Depthwise convs keep the shifted multiply-adds, which come first.
    dw = _spec(1, 16, 144, 144, groups=144)
    assert default_algorithm(dw, "inference", "avx512")[0] == "depthwise"


@pytest.mark.with_onednn
@pytest.mark.skipif(not onednn.available(), reason="the onednn extension did not load")
def test_an_ice_lake_runs_xla_on_4x4_512_channel_convs():
    # On the AVX-512 kind without bf16 units (an Ice Lake Xeon), XLA's conv on ResNet-18
    # CIFAR's 4x4 512-channel convs, where the AVX-512 rules give oneDNN: training from
    # batch 16 1.05-1.11x faster, inference at 1, 8 and 32 1.04-1.15x
    # (benchmarks/results/ab_4x4_xla_icelake_cpu.md); the Zen 4 (avx512_bf16) keeps oneDNN.
    spec = _spec(1, 4, 512, 512)
    for batch in (16, 32, 128, 256):
        at = spec._replace(batch=batch)
        assert default_algorithm(at, "train", "avx512") == (
            "xla",
            "default table (avx512, train, float32), in oneDNN's place on this CPU kind",
        )
        assert default_algorithm(at, "train", "avx512_bf16")[0] == "onednn"
    for batch in (1, 8, 16, 32):
        at = spec._replace(batch=batch)
        assert default_algorithm(at, "inference", "avx512")[0] == "xla"
        assert default_algorithm(at, "inference", "avx512_bf16")[0] == "onednn"
    # Below 16 the training rules of both kinds agree (im2col), and so does inference from
    # 33; the rule takes neither 2x2 inputs (im2col everywhere) nor 8x8 ones or fewer channels.
    for objective, batch in (("train", 8), ("inference", 64), ("inference", 128)):
        at = spec._replace(batch=batch)
        want = default_algorithm(at, objective, "avx512_bf16")[0]
        assert default_algorithm(at, objective, "avx512")[0] == want
    for other in (_spec(32, 2, 512, 512), _spec(32, 8, 512, 512), _spec(32, 4, 256, 256)):
        for objective in ("train", "inference"):
            want = default_algorithm(other, objective, "avx512_bf16")[0]
            assert default_algorithm(other, objective, "avx512")[0] == want
    # A bfloat16 conv widened to float32 there takes the rule in training (1.04x at 32), not
    # in inference, where oneDNN's kernel is widened once when packed and XLA's conv would
    # widen it on every call (0.80x at batch 1).
    half = spec._replace(batch=32, dtype="bfloat16")
    assert default_algorithm(half, "train", "avx512")[0] == "xla"
    assert default_algorithm(half._replace(batch=1), "inference", "avx512")[0] == "onednn"


def test_without_onednn_an_ice_lake_keeps_the_shared_rules_on_4x4_512_channel_convs():
    # The override takes only what oneDNN would run: where the extension is absent (this
    # module's fixture) both AVX-512 kinds get the XLA compositions measured for them.
    spec = _spec(1, 4, 512, 512)
    for objective, batch in (("train", 16), ("train", 32), ("train", 128), ("inference", 8)):
        at = spec._replace(batch=batch)
        want = default_algorithm(at, objective, "avx512_bf16")[0]
        assert default_algorithm(at, objective, "avx512")[0] == want
    assert default_algorithm(spec._replace(batch=32), "train", "avx512")[0] == "im2col"


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
            half = spec._replace(dtype="bfloat16")
            assert default_algorithm(half, "train", "avx2")[0] == "xla"
            # Without bfloat16 units a bfloat16 conv widens to float32 and takes its rule.
            assert default_algorithm(half, "train", "avx512")[0] == "depthwise"
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
    # Winograd F(4x4) refuses bfloat16 and nothing was measured there; GPU has no rules. On
    # AVX-512 without bfloat16 units the conv is widened, and Winograd runs it in float32.
    half = _spec(128, 16, 128, 128, dtype="bfloat16")
    assert default_algorithm(half, "train", "avx2")[0] == "xla"
    assert default_algorithm(half, "train", "avx512")[0] == "winograd4_full"
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
    # On AVX-512 too, all three Winograd on ResNet-50's 14x14x256 and 7x7x512 convs and
    # ResNet-18's 8x8x256 ones in training from batch 8 (on a Zen 4 ResNet-50's step 1.05x
    # faster at 8 and 16, ResNet-18's 1.03x at 16, even at 8), from 32 by the batch-128 rule.
    for size, channels, first in ((8, 256, "xla"), (14, 256, "xla"), (7, 512, "im2col")):
        by_batch = [default_algorithm(_spec(b, size, channels, channels), "train", "avx512")[0]
                    for b in (1, 7, 8, 16, 31, 32)]  # fmt: skip
        assert by_batch == [first, "xla"] + ["winograd4_full"] * 4, (size, by_batch)
    assert default_algorithm(_spec(16, 28, 128, 128), "train", "avx512")[0] == "xla"
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
