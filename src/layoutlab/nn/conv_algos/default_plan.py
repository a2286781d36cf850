"""The shipped conv table: what an ``"auto"`` conv runs when nothing was tuned for it.

Each rule names a conv shape class, the batch sizes it holds for, and the algorithm the
autotuner measured fastest on it (forward, input and weight gradient together for training;
the forward for inference), per CPU kind and compute dtype. A shape or batch no rule names
runs ``xla``, and so does every conv on GPU: nothing is measured there yet. The rules follow
measurements against ``xla`` in interleaved rounds (float32, NHWC, ``cpu_fast_options``;
docs/performance/measurements.md#the-shipped-conv-table).
A 3x3 conv on an input smaller than its kernel (``_TINY_INPUT``) runs im2col on every kind.

Winograd F(4x4,3x3) refuses half-precision compute (its error), so in bfloat16 and float16 only the
im2col rules apply; they were measured in float32 only, so those dtypes get none, but for bfloat16
on an AVX-512 CPU with bfloat16 units (the kind ``avx512_bf16``: ``fast_defaults.table_cpu_kind``):
there oneDNN multiplies bfloat16 in hardware where XLA:CPU widens the conv to float32, and
``mixed_bf16``'s ResNet-18 CIFAR step ran faster with oneDNN's convs (the ``_ONEDNN`` rules). On
plain AVX-512 (``WIDEN_KINDS``) a bfloat16 conv takes its float32 twin's rule on operands widened
to float32 (``widened_dtype``): oneDNN only emulates bfloat16 there. Other kinds keep XLA's
bfloat16 convs. ``table_key`` keys every other dtype by the kind without its ``_bf16`` suffix;
``ONEDNN_OVERRIDES`` take some of oneDNN's convs back where one such kind measured otherwise.
"""

from __future__ import annotations

from typing import NamedTuple

from layoutlab.fast_defaults import BF16_SUFFIX
from layoutlab.nn.conv_algos.geometry import ConvSpec

__all__ = [
    "DEFAULT_RULES",
    "ONEDNN_FLOAT32_INFER_MAX_BATCH",
    "ONEDNN_FLOAT32_TRAIN_MIN_BATCH",
    "ONEDNN_OVERRIDES",
    "Rule",
    "WIDENED_OVERRIDDEN",
    "WIDEN_KINDS",
    "default_algorithm",
    "table_key",
    "widened_dtype",
]


class Rule(NamedTuple):
    """A shape class: kernel, strides, in-channel bounds, the fewest out-channels, spatial
    size bounds and the batch sizes it was measured to win at (``min_batch`` to
    ``max_batch``, inclusive): the same conv at batch 1 and at batch 128 is a different
    amount of work, and what wins at one can lose at the other. ``depthwise``: the class
    holds depthwise convs (one group per input channel) instead of ungrouped ones."""

    algorithm: str
    kernel: tuple[int, int]
    strides: tuple[int, int]
    min_in: int = 1
    max_in: int | None = None
    max_size: int | None = None
    min_size: int = 1
    min_batch: int = 1
    max_batch: int | None = None
    depthwise: bool = False
    min_out: int = 1

    def matches(self, spec: ConvSpec) -> bool:
        g = spec.geometry
        groups = spec.in_features if self.depthwise else 1
        if g.kernel_size != self.kernel or g.strides != self.strides or g.groups != groups:
            return False
        if g.dilation != (1, 1) or spec.in_features < self.min_in:
            return False
        if spec.out_features < self.min_out:
            return False
        if spec.batch < self.min_batch or (
            self.max_batch is not None and spec.batch > self.max_batch
        ):
            return False
        if self.max_in is not None and spec.in_features > self.max_in:
            return False
        size = max(spec.in_size)
        return min(spec.in_size) >= self.min_size and (
            self.max_size is None or size <= self.max_size
        )


_WINOGRAD_SMALL = dict(kernel=(3, 3), strides=(1, 1), min_in=128, max_size=16)
# ResNet-50's 28x28, 14x14 and 7x7 stage convs on AVX-512 from batch 16, inference only: in
# training the same convs won one by one (1.15-1.28x) but the whole ResNet-50 step read
# 0.96x [0.84, 1.02] with them, inference 1.02x [1.00, 1.04] (A/B in one run). No 4x4 input
# (where Winograd lost at batch 8). The batch bound is set where the rule is used.
_WINOGRAD_MID = dict(kernel=(3, 3), strides=(1, 1), min_in=128, min_size=7, max_size=28)
# ResNet-18 CIFAR's 32x32x64 and 16x16x128 stage convs on AVX2 at batch 1-32, training.
_WINOGRAD_STAGES = dict(kernel=(3, 3), strides=(1, 1), min_in=64, max_in=128, min_size=16,
                        max_size=32)  # fmt: skip
# ResNet-50's 14x14x256 and 7x7x512 stage convs and ResNet-18 CIFAR's 8x8x256 ones, training
# from batch 8 (on AVX2 at batch 1 the 8x8x256 convs take gemm_dw).
_WINOGRAD_WIDE = dict(kernel=(3, 3), strides=(1, 1), min_in=256, min_size=7, max_size=14)
# The stem rule was measured at 32x32x3 only; the digits job's 8x8x1 stem ran slower with it, so
# smaller inputs keep ``xla``. It won with 64 out-channels (ResNet-18, VGG-11), not with U-Net's 16,
# so fewer channels keep ``xla`` (docs/performance/measurements.md#the-shipped-conv-table).
_IM2COL_STEM = dict(kernel=(3, 3), strides=(1, 1), max_in=4, min_size=32, min_out=64)
# XLA rewrites a conv whose input is smaller than its kernel (a 3x3 conv on 2x2 or 1x1: VGG-11's
# last block or an ImageNet-stem ResNet's layer4 on 32x32 images) into one with input and kernel
# swapped (``dim_labels=01fb_o01i->f01b``), which XLA:CPU runs far slower than im2col's dot
# (docs/performance/measurements.md#the-shipped-conv-table). The rewrite is XLA's, before any
# CPU-specific code, so both kinds get the rule.
_TINY_INPUT = (
    Rule("im2col", (3, 3), (1, 1), max_size=2),
    Rule("im2col", (3, 3), (2, 2), max_size=2),
)
# MobileNetV2's 3x3 depthwise convs, both strides: XLA:CPU's grouped conv runs them many
# times slower than the shifted multiply-adds, on both kinds and in both objectives.
_DEPTHWISE = (
    Rule("depthwise", (3, 3), (1, 1), depthwise=True),
    Rule("depthwise", (3, 3), (2, 2), depthwise=True),
)
# The ungrouped, undilated kernel/stride pairs the oneDNN rules take: ResNet-18 CIFAR's, where
# they were measured on whole steps (its stem and stage 3x3 convs, the 3x3 stride-2 ones, the
# 1x1 shortcuts), and the ImageNet stem's 7x7 stride-2 conv, measured one by one: oneDNN's
# forward and weight gradient ran 1.1-2.7x XLA's at batch 1 and 32, float32 and bfloat16
# (onednn_conv_table_zen4_cpu.md; its input gradient is never computed); on whole ResNet-50
# steps even, or 1.03-1.04x in bfloat16 at batch 16 (stem7x7_whole_step_zen4_cpu.md).
_ONEDNN_SHAPES = (
    ((3, 3), (1, 1)),
    ((3, 3), (2, 2)),
    ((1, 1), (2, 2)),
    ((1, 1), (1, 1)),
    ((7, 7), (2, 2)),
)


# From this batch the AVX-512 table trains float32 convs on oneDNN (its rule below says why).
ONEDNN_FLOAT32_TRAIN_MIN_BATCH = 16
# Up to this batch the AVX-512 table runs float32 inference convs on oneDNN (the rule says why).
ONEDNN_FLOAT32_INFER_MAX_BATCH = 32


# A stem conv's few input channels: XLA's weight gradient beat oneDNN's there.
_FEW_CHANNELS = 15


def _onednn(algorithm: str, **bounds) -> tuple[Rule, ...]:
    return tuple(Rule(algorithm, k, s, **bounds) for k, s in _ONEDNN_SHAPES)


# (cpu kind, objective, dtype) -> rules, first match wins. Batch bounds: AVX2 measured at batch 1 to
# 256, AVX-512 at 1, 8, 32 and 128 (docs/performance/measurements.md#the-shipped-conv-table). A
# batch between two measured ones where they disagree (the 4x4 conv at 9-31) runs ``xla``.
DEFAULT_RULES: dict[tuple[str, str, str], tuple[Rule, ...]] = {
    ("avx2", "train", "float32"): (
        *_TINY_INPUT,
        # The AVX-512 small-batch rules, bounded where batch 32 lost with them: the kernel
        # transposes of XLA's input-gradient convs on 512-channel kernels took 15-18 ms
        # each at batch 1 (train_table_small_batch_avx2_cpu.md).
        Rule("im2col", (3, 3), (1, 1), min_in=512, max_size=4, max_batch=8),
        # XLA's forward and input gradient, im2col's GEMM weight gradient: ResNet-18 CIFAR's
        # 8x8x256 convs 1.22x one by one at batch 1, its step 1.03-1.04x in two runs;
        # ResNet-50's 14x14x256 ones left its step even, so they keep XLA's conv.
        Rule(
            "gemm_dw", (3, 3), (1, 1), min_in=256, max_in=256, min_size=8, max_size=8, max_batch=1
        ),
        # ResNet-50's 14x14x256 and 7x7x512 convs and ResNet-18 CIFAR's 8x8x256 ones, all
        # three passes by Winograd: ResNet-50's step 1.03-1.05x faster at 8, 16 and 32,
        # ResNet-18's 1.03-1.13x at 8, 16, 32 and 64, 1.29x at 96 with the next rule from 65
        # (train_table_small_batch_avx2_cpu.md); from 128 the next rule's.
        Rule("winograd4_full", **_WINOGRAD_WIDE, min_batch=8, max_batch=127),
        # Measured at 128, and at 96 (with the rule above, ResNet-18 CIFAR's step 1.29x
        # [1.25, 1.37] faster than XLA's convs there; 1.24x with this rule alone).
        Rule("winograd4_xla_dw", **_WINOGRAD_SMALL, min_batch=65),
        # ResNet-18 CIFAR's 32x32 and 16x16 stage convs: 2.15x and 1.18x one by one at batch
        # 1, the whole step 1.15x faster at 1, 1.04-1.09x at 8, 1.13-1.15x at 32 with it.
        Rule("winograd4_full", **_WINOGRAD_STAGES, max_batch=32),
        Rule("im2col", (3, 3), (1, 1), min_in=512, max_size=7, max_batch=1),
        Rule("im2col", (3, 3), (2, 2), min_in=256, max_size=28, max_batch=1),
        Rule("im2col", (3, 3), (2, 2), min_in=256, max_size=8, max_batch=8),
        Rule("im2col", (1, 1), (2, 2), max_in=128, min_size=16),
        # The wider 1x1 stride-2 convs: ResNet-18's 1.69x at batch 1, ResNet-50's 1.08-1.36x
        # at 1, 8 and 32 (conv_rules_by_batch_avx2_cpu.md); at 128 im2col ran ResNet-18's
        # 0.89x of XLA's conv (conv_autotune_resnet18_cifar_b128_train_cpu.md).
        Rule("im2col", (1, 1), (2, 2), max_batch=32),
        Rule("im2col", (1, 1), (1, 1), min_in=64, max_batch=1),
        Rule("im2col", **_IM2COL_STEM),
        Rule("phase_dx", (3, 3), (2, 2), max_batch=32),
        *_DEPTHWISE,
    ),
    ("avx2", "inference", "float32"): (
        *_TINY_INPUT,
        *_DEPTHWISE,
        # From 16: ResNet-50's whole inference step 1.09x faster there, ResNet-18 CIFAR's
        # even (0.97x [0.94, 1.01]); at 8 ResNet-18's even too (conv_autotune_infer_avx2_cpu.md).
        Rule("winograd4_xla_dw", **_WINOGRAD_MID, min_batch=16),
        Rule("winograd4_xla_dw", **_WINOGRAD_SMALL, min_batch=128),
    ),
    ("avx512", "train", "float32"): (
        *_TINY_INPUT,
        # oneDNN's float32 convs from batch 16: ResNet-50's training step 1.56x faster at 16,
        # ResNet-18 CIFAR's 1.12x and 1.15x at 32, 1.14x at 128 and 1.17x at 256; at 8
        # ResNet-18 lost 0.95x, 16 unmeasured for it (quiet Zen 4,
        # onednn_defaults_resnet18_zen4_cpu_3.md).
        *_onednn("onednn", min_batch=ONEDNN_FLOAT32_TRAIN_MIN_BATCH),
        Rule("im2col", (3, 3), (1, 1), min_in=512, max_size=4, max_batch=32),
        Rule("winograd4_full", **_WINOGRAD_SMALL, min_batch=32),
        # The AVX2 table's wide rule, up to where the one above starts. On a Zen 4 (not
        # measured on the Sapphire Rapids): ResNet-50's training step 1.05x faster at batch 8
        # and 16 (twice), ResNet-18 CIFAR's 1.03x at 16 and even at 8 (every_batch_zen4_cpu.md,
        # fourth run); ResNet-34 ImageNet-stem's at 224x224 1.15x at 8 and 1.21x at 16 (fifth).
        Rule("winograd4_full", **_WINOGRAD_WIDE, min_batch=8, max_batch=31),
        # ResNet-50's 7x7 and 14x14/28x28 stride-2 3x3 convs at batch 1: 2.6x and 1.7-2.6x
        # one by one, the whole step 1.05x and 1.04x faster (train_step_b1_avx512_cpu.md).
        Rule("im2col", (3, 3), (1, 1), min_in=512, max_size=7, max_batch=1),
        Rule("im2col", (3, 3), (2, 2), min_in=256, max_size=28, max_batch=1),
        Rule("im2col", (3, 3), (2, 2), min_in=256, max_size=8, max_batch=32),
        Rule("im2col", (1, 1), (2, 2)),
        Rule("im2col", (1, 1), (1, 1), min_in=64, max_batch=1),
        Rule("im2col", **_IM2COL_STEM),
        # After the im2col rules: at batch 1 im2col beat it on the stride-2 convs it takes.
        Rule("phase_dx", (3, 3), (2, 2)),
        *_DEPTHWISE,
    ),
    ("avx512", "inference", "float32"): (
        *_TINY_INPUT,
        *_DEPTHWISE,
        # oneDNN's float32 convs up to batch 32: ResNet-18 CIFAR's inference step 1.19x faster
        # at batch 1 and 1.06x at 8, ResNet-50's 1.03x and 1.08x (onednn_defaults_resnet18_
        # zen4_cpu_2.md); against this table without it, ResNet-50 1.07x at 16 and even at 32,
        # ResNet-18 CIFAR 1.17x at 16 and 1.07x at 32, ResNet-34 ImageNet 1.16x and U-Net 1.25x
        # at 16, VGG-11 even; at 128 and 256 Winograd beat it (0.92x, 0.95x), quiet Zen 4
        # (onednn_fp32_inference_by_batch_zen4_cpu.md).
        *_onednn("onednn", max_batch=ONEDNN_FLOAT32_INFER_MAX_BATCH),
        # From 32: at 16 ResNet-50 gained 1.01x [1.00, 1.04] with it and ResNet-18 CIFAR's
        # 8x8 and 16x16 convs lost its inference step 0.88x; at 32 ResNet-18 gained 1.04x.
        Rule("winograd4_full", **_WINOGRAD_MID, min_batch=32),
        # Of this rule's convs the one above leaves only the 4x4 ones (ResNet-18 CIFAR's
        # layer4), where the whole inference step ran 0.92x at batch 32 and 0.98x at 64
        # with Winograd, 1.03x at 128 (winograd_inference_by_batch_avx512_cpu.md).
        Rule("winograd4_full", **_WINOGRAD_SMALL, min_batch=128),
        Rule("im2col", **_IM2COL_STEM),
    ),
    # bfloat16 on AVX-512 with bf16 units, where XLA widens bf16 convs to float32: oneDNN's
    # convs, and its weight gradient too once its slow bfloat16 kernels were routed to
    # float32 below batch 8 (onednn.choice): ResNet-18 CIFAR's weight gradients 1.3-2.5x
    # XLA's one by one at batch 8 and 32, but the 3-channel stem's (0.16x and 0.73x), which
    # keeps XLA's (docs/performance/onednn_kernels.md; whole steps before that change: the
    # onednn_xla_dw rule measured in onednn_table_rules_zen4_cpu.md).
    # No batch bound: at 256 too, oneDNN ran ResNet-18 CIFAR's training step 2.25x and its
    # inference step 2.45x faster than XLA's convs (onednn_defaults_resnet18_zen4_cpu_3.md).
    ("avx512_bf16", "train", "bfloat16"): (
        Rule("onednn_xla_dw", (3, 3), (1, 1), max_in=_FEW_CHANNELS),
        *_onednn("onednn"),
    ),
    # Its inference step 1.26x faster at batch 1, 2.59x at 8, 2.47-2.89x at 32, 2.43x at 128.
    # (Float32 inference at batch 1 to 32: the AVX-512 table's oneDNN rule.)
    ("avx512_bf16", "inference", "bfloat16"): _onednn("onednn"),
}


# Where CPUs that share the AVX-512 float32 rules measured otherwise: per whole CPU kind
# (``table_cpu_kind``), rules that take a conv the shared rules give ``onednn`` (so only where
# the extension loaded, and at the batches of the oneDNN rules). On an Ice Lake Xeon
# (``avx512``, no bfloat16 units) XLA's conv beat oneDNN's on ResNet-18 CIFAR's 4x4
# 512-channel convs, one by one (forward 14 against 23 ms at batch 32, weight gradient 15
# against 21) and in whole steps: training 1.05-1.11x faster at batch 16, 32, 128 and 256,
# inference 1.04-1.15x at 1, 8 and 32 (ab_4x4_xla_icelake_cpu.md). On the Zen 4
# (``avx512_bf16``) oneDNN's forward was the faster there at batch 1 (0.86 against 1.40 ms),
# so that kind keeps oneDNN. Widened bfloat16 convs: ``WIDENED_OVERRIDDEN``.
ONEDNN_OVERRIDES: dict[tuple[str, str, str], tuple[Rule, ...]] = {
    ("avx512", objective, "float32"): (
        Rule("xla", (3, 3), (1, 1), min_in=512, min_size=4, max_size=4),
    )
    for objective in ("train", "inference")
}


# The objectives in which a widened conv (``widened_dtype``) takes ``ONEDNN_OVERRIDES`` too.
# Not inference: packing rounds and widens a oneDNN conv's kernel once, but XLA's conv would
# round it on every call (ResNet-18 CIFAR's mixed_bf16 inference 0.80x at batch 1 with the
# override, 0.85-0.95x at 8 to 32); training rounds every step either way (1.04x at 32).
# A training run's eval step plans as inference too but packs nothing; it was not measured.
WIDENED_OVERRIDDEN = ("train",)


# The CPU kinds without bfloat16 units whose bfloat16 convs compute in float32: AVX-512 (an
# Ice Lake Xeon: widened_dtype). AVX2 lacks the units too but was not measured.
WIDEN_KINDS = ("avx512",)


def table_key(cpu_kind: str | None, objective: str, dtype: str) -> tuple[str, str, str]:
    """The ``DEFAULT_RULES`` key of a ``dtype`` conv on ``cpu_kind`` (``table_cpu_kind``):
    bfloat16 rules are keyed by the whole kind (``"avx512_bf16"`` only where the CPU has
    bfloat16 units), every other dtype's by the kind without ``BF16_SUFFIX``."""
    kind = cpu_kind or ""
    if dtype != "bfloat16":
        kind = kind.removesuffix(BF16_SUFFIX)
    return kind, objective, dtype


def widened_dtype(spec: ConvSpec, cpu_kind: str | None) -> str | None:
    """``"float32"`` where a ``spec`` conv computes on float32 operands: a bfloat16 conv on a
    CPU kind without bfloat16 units (``WIDEN_KINDS``), else None. There a bfloat16 conv
    missed the float32 rules' faster algorithms and oneDNN's emulates bfloat16, so the conv
    widens its operands (exactly) and runs the float32 rules
    (docs/performance/measurements.md#widened-bfloat16-convs)."""
    return "float32" if spec.dtype == "bfloat16" and cpu_kind in WIDEN_KINDS else None


def default_algorithm(spec: ConvSpec, objective: str, cpu_kind: str | None) -> tuple[str, str]:
    """``(algorithm, why)`` for ``spec`` from the table (``cpu_kind`` None: not a CPU run);
    ``xla`` when no rule matches or the matching algorithm does not take the shape. A spec
    that ``widened_dtype`` widens is looked up as its float32 twin (``ONEDNN_OVERRIDES`` only in
    the objectives of ``WIDENED_OVERRIDDEN``)."""
    from layoutlab.nn.conv_algos.registry import XLA, get_algorithm

    wide = widened_dtype(spec, cpu_kind)
    dtype = spec.dtype if wide is None else f"{spec.dtype} widened to {wide}"
    if wide is not None:
        spec = spec._replace(dtype=wide)

    def first(rules: tuple[Rule, ...]) -> Rule | None:
        # The first rule that matches and whose algorithm takes the shape.
        ok = (
            r
            for r in rules
            if r.matches(spec) and get_algorithm(r.algorithm).supports(spec) is None
        )
        return next(ok, None)

    rule = first(DEFAULT_RULES.get(table_key(cpu_kind, objective, spec.dtype), ()))
    if rule is None:
        where = f"{cpu_kind} CPU" if cpu_kind else "this backend"
        return XLA, f"default table: no rule for this shape on {where}"
    why = f"default table ({cpu_kind}, {objective}, {dtype})"
    if rule.algorithm == "onednn" and (wide is None or objective in WIDENED_OVERRIDDEN):
        over = first(ONEDNN_OVERRIDES.get((cpu_kind or "", objective, spec.dtype), ()))
        if over is not None:
            return over.algorithm, f"{why}, in oneDNN's place on this CPU kind"
    return rule.algorithm, why
