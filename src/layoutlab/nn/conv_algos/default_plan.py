"""The shipped conv table: what an ``"auto"`` conv runs when nothing was tuned for it.

Each rule names a conv shape class, the batch sizes it holds for, and the algorithm the
autotuner measured fastest on it (forward, input and weight gradient together for training;
the forward for inference), per CPU kind and compute dtype. A shape or batch no rule names
runs ``xla``, and so does every conv on GPU: nothing is measured there yet. The
measurements behind the rules, each against ``xla`` in interleaved rounds, float32, NHWC,
with ``cpu_fast_options``:

- AVX2 (2-core AMD EPYC): at batch 128 on an idle machine (2026-11-22,
  ``benchmarks/results/conv_autotune_resnet18_cifar_b128_train_cpu.md``), Winograd forward
  and input gradient with XLA's weight gradient on 3x3 stride-1 convs at 16x16 and below
  with 128+ channels (150 against 184, 122 against 179, 115 against 172 ms); im2col on 1x1
  stride-2 convs at 16x16 and above (20 against 32, 14 against 17 ms). Across batch 1-256
  on a shared machine (2026-11-25, ``benchmarks/results/conv_rules_by_batch_avx2_cpu.md``):
  the same Winograd ran 0.1-0.7x of ``xla`` at batch 1 (7 of 10 shapes; ties on the rest)
  and 0.3-1.4x at batch 8-64 in training, so training keeps it from batch 128; in
  inference it won at batch 32 on 8x8 and larger inputs but lost on 4x4 below 128; im2col
  won or tied at every batch on ResNet-18's 64- and 128-channel shapes, not clearly on
  ResNet-50's wider ones.
- AVX-512 (2-core AMD EPYC with AVX-512 and bf16, 2026-11-24,
  ``benchmarks/results/conv_defaults_resnet18_cifar_b128_cpu.md``): all three Winograd
  (``winograd4_full``) on those 3x3 convs, because YNNPACK's dots use AVX-512 and Eigen's
  convs do not; im2col on every 1x1 stride-2 conv and on the 3-channel stem at 32x32 and
  above. Measured at batch 128 only, so these rules start at batch 128.

Winograd F(4x4,3x3) refuses half-precision compute (its error), so in bfloat16 and float16
only the im2col rules apply; they were measured in float32 only, so those dtypes get none.
"""

from __future__ import annotations

from typing import NamedTuple

from layoutlab.nn.conv_algos.geometry import ConvSpec

__all__ = ["Rule", "DEFAULT_RULES", "default_algorithm"]


class Rule(NamedTuple):
    """A shape class: kernel, strides, in-channel bounds, spatial size bounds and the batch
    sizes it was measured to win at (``min_batch`` to ``max_batch``, inclusive): the same
    conv at batch 1 and at batch 128 is a different amount of work, and what wins at one
    can lose at the other."""

    algorithm: str
    kernel: tuple[int, int]
    strides: tuple[int, int]
    min_in: int = 1
    max_in: int | None = None
    max_size: int | None = None
    min_size: int = 1
    min_batch: int = 1
    max_batch: int | None = None

    def matches(self, spec: ConvSpec) -> bool:
        g = spec.geometry
        if g.kernel_size != self.kernel or g.strides != self.strides or g.groups != 1:
            return False
        if g.dilation != (1, 1) or spec.in_features < self.min_in:
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
# The stem rule was measured at 32x32x3 only; the digits job's 8x8x1 stem ran slower with
# it (benchmarks/results/digits_train_defaults_cpu.md), so smaller inputs keep ``xla``.
_IM2COL_STEM = dict(kernel=(3, 3), strides=(1, 1), max_in=4, min_size=32)
# (cpu kind, objective, dtype) -> rules, first match wins. Batch bounds: AVX2 from
# benchmarks/results/conv_rules_by_batch_avx2_cpu.md (batch 1 to 256); AVX-512 was measured
# at batch 128 only, so its rules start there (smaller batches run ``xla``: on AVX2 the same
# Winograd rules lost up to 10x at batch 1 and 8).
DEFAULT_RULES: dict[tuple[str, str, str], tuple[Rule, ...]] = {
    ("avx2", "train", "float32"): (
        Rule("winograd4_xla_dw", **_WINOGRAD_SMALL, min_batch=128),
        Rule("im2col", (1, 1), (2, 2), max_in=128, min_size=16),
    ),
    ("avx2", "inference", "float32"): (
        Rule("winograd4_xla_dw", **{**_WINOGRAD_SMALL, "min_size": 8}, min_batch=32),
        Rule("winograd4_xla_dw", **_WINOGRAD_SMALL, min_batch=128),
    ),
    ("avx512", "train", "float32"): (
        Rule("winograd4_full", **_WINOGRAD_SMALL, min_batch=128),
        Rule("im2col", (1, 1), (2, 2), min_batch=128),
        Rule("im2col", **_IM2COL_STEM, min_batch=128),
    ),
    ("avx512", "inference", "float32"): (
        Rule("winograd4_full", **_WINOGRAD_SMALL, min_batch=128),
        Rule("im2col", **_IM2COL_STEM, min_batch=128),
    ),
}


def default_algorithm(spec: ConvSpec, objective: str, cpu_kind: str | None) -> tuple[str, str]:
    """``(algorithm, why)`` for ``spec`` from the table (``cpu_kind`` None: not a CPU run);
    ``xla`` when no rule matches or the matching algorithm does not take the shape."""
    from layoutlab.nn.conv_algos.registry import XLA, get_algorithm

    rules = DEFAULT_RULES.get((cpu_kind or "", objective, spec.dtype), ())
    for rule in rules:
        if rule.matches(spec) and get_algorithm(rule.algorithm).supports(spec) is None:
            return rule.algorithm, f"default table ({cpu_kind}, {objective}, {spec.dtype})"
    where = f"{cpu_kind} CPU" if cpu_kind else "this backend"
    return XLA, f"default table: no rule for this shape on {where}"
