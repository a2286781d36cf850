"""The conv table's CPU kinds and its oneDNN rules: an AVX-512 CPU with bfloat16 units
(``avx512_bf16`` or AMX) is the kind ``avx512_bf16``, whose bfloat16 convs run oneDNN's
(``mixed_bf16`` computes them in bfloat16 instead of XLA's float32-widened convs); on plain
AVX-512 they take their float32 twin's rule on widened operands (``test_conv_widen_bf16.py``),
on AVX2 and elsewhere XLA's; float32 rules are the AVX-512 ones on both AVX-512 kinds; and
where the extension is unavailable the same convs fall back to their old choice. The CPU
flags are monkeypatched, so this holds on any machine."""

import pytest
from onednn_helpers import needs_onednn, simulate_no_onednn

from layoutlab import fast_defaults
from layoutlab.bench import machine
from layoutlab.nn.conv_algos.default_plan import (
    DEFAULT_RULES,
    ONEDNN_OVERRIDES,
    default_algorithm,
    table_key,
)
from layoutlab.nn.conv_algos.geometry import make_spec, resolve_geometry
from layoutlab.precision import get_policy


def _spec(n, size, cin, cout, k=3, stride=1, dtype="bfloat16"):
    geom = resolve_geometry((size, size), k, stride, "SAME")
    return make_spec((n, size, size, cin), cout, geom, dtype=dtype, layout="NHWC")


# ResNet-18 CIFAR's distinct convs at batch n: the stem, the stage convs, the stride-2 ones
# and the 1x1 stride-2 shortcuts.
def _resnet18_cifar(n, dtype="bfloat16"):
    return [
        _spec(n, 32, 3, 64, dtype=dtype),
        *(_spec(n, s, c, c, dtype=dtype) for s, c in ((32, 64), (16, 128), (8, 256), (4, 512))),
        *(_spec(n, s, c, 2 * c, stride=2, dtype=dtype) for s, c in ((32, 64), (16, 128), (8, 256))),
        *(_spec(n, s, c, 2 * c, 1, 2, dtype) for s, c in ((32, 64), (16, 128), (8, 256))),
    ]


@pytest.mark.parametrize(
    ("flags", "kind"),
    [
        (None, "other"),
        (["sse2"], "other"),
        (["avx2", "fma"], "avx2"),
        (["avx2", "avx512f"], "avx512"),
        (["avx2", "avx512f", "avx512_bf16"], "avx512_bf16"),
        (["avx2", "avx512f", "amx_bf16", "amx_tile"], "avx512_bf16"),
    ],
)
def test_the_table_kind_names_bf16_units_and_machine_json_records_it(monkeypatch, flags, kind):
    monkeypatch.setattr(fast_defaults, "_cpu_flags", lambda: flags)
    assert fast_defaults.table_cpu_kind("cpu") == kind
    assert fast_defaults.table_cpu_kind("gpu") is None
    assert fast_defaults.cpu_kind() == kind.removesuffix("_bf16")
    assert machine.machine_info()["cpu_kind"] == kind


def test_only_bfloat16_convs_key_the_table_by_the_bf16_kind():
    assert table_key("avx512_bf16", "train", "float32") == ("avx512", "train", "float32")
    assert table_key("avx512_bf16", "train", "bfloat16") == ("avx512_bf16", "train", "bfloat16")
    assert table_key("avx512", "inference", "bfloat16") == ("avx512", "inference", "bfloat16")
    assert table_key(None, "train", "float32") == ("", "train", "float32")
    # bfloat16 rules exist for the bf16 kind only; float32 rules for the plain kinds only.
    for kind, objective, dtype in DEFAULT_RULES:
        assert (dtype == "bfloat16") == kind.endswith("_bf16"), (kind, objective, dtype)


# (objective, batch) -> the algorithm every ResNet-18 CIFAR conv gets in bfloat16 on a CPU
# with bf16 units (benchmarks/results/onednn_table_rules_zen4_cpu.md; 256:
# onednn_defaults_resnet18_zen4_cpu_3.md), but the 3-channel stem
# in training, whose weight gradient stays XLA's (docs/performance/onednn_kernels.md).
BF16_CHOICES = {
    **{("inference", n): "onednn" for n in (1, 8, 32, 128, 256)},
    **{("train", n): "onednn" for n in (1, 8, 32, 128, 256)},
}
STEM_TRAIN = "onednn_xla_dw"


@needs_onednn
@pytest.mark.parametrize(("objective", "batch"), list(BF16_CHOICES))
def test_bfloat16_convs_run_onednn_only_on_a_cpu_with_bf16_units(objective, batch):
    for spec in _resnet18_cifar(batch):
        got = default_algorithm(spec, objective, "avx512_bf16")
        stem = objective == "train" and spec.in_features == 3
        assert got[0] == (STEM_TRAIN if stem else BF16_CHOICES[objective, batch]), (spec, got)
        for kind in ("avx2", "other", None):
            assert default_algorithm(spec, objective, kind)[0] == "xla", (kind, spec)
        for kind in ("avx512",):
            # Its float32 twin's algorithm; in inference without the kind's overrides, which
            # would widen the kernel on every call (default_plan.default_algorithm).
            twin_kind = kind if objective == "train" else "avx512_bf16"
            twin = default_algorithm(spec._replace(dtype="float32"), objective, twin_kind)[0]
            assert default_algorithm(spec, objective, kind)[0] == twin, (kind, spec)
        # No batch bound: at 256 oneDNN won the whole step 2.25x (train) and 2.45x (infer).
        assert default_algorithm(spec._replace(batch=1024), objective, "avx512_bf16")[0] == got[0]
    # A float32 conv on the bf16 kind gets the AVX-512 float32 rules; the kind without bf16
    # units (an Ice Lake) too, but for the oneDNN convs it takes back (ONEDNN_OVERRIDES).
    ice_lake = ONEDNN_OVERRIDES[("avx512", objective, "float32")]
    for spec in _resnet18_cifar(batch, "float32"):
        got = default_algorithm(spec, objective, "avx512_bf16")[0]
        overridden = got == "onednn" and any(rule.matches(spec) for rule in ice_lake)
        assert default_algorithm(spec, objective, "avx512")[0] == ("xla" if overridden else got)


@needs_onednn
def test_the_imagenet_stem_runs_onednn_in_bfloat16():
    # ResNet-50's 7x7 stride-2 RGB stem at batch 32: oneDNN's forward 1.9x and weight
    # gradient (its float32 kernel, onednn.choice) 2.7x XLA's (onednn_conv_table_zen4_cpu.md).
    stem = _spec(32, 224, 3, 64, k=7, stride=2, dtype="bfloat16")
    for objective in ("train", "inference"):
        for batch in (1, 32, 256):
            got = default_algorithm(stem._replace(batch=batch), objective, "avx512_bf16")
            assert got[0] == "onednn", (objective, batch, got)


def test_without_the_extension_the_same_convs_keep_their_old_choice(monkeypatch):
    simulate_no_onednn(monkeypatch)
    for objective, batch in BF16_CHOICES:
        for spec in _resnet18_cifar(batch):
            assert default_algorithm(spec, objective, "avx512_bf16")[0] == "xla", spec


@needs_onednn
def test_a_mixed_bf16_model_plans_onednn_on_the_bf16_kind_only():
    """``mixed_bf16`` computes its convs in bfloat16, so its plan reads the bfloat16 rules."""
    import jax
    from flax import nnx

    from layoutlab import nn
    from layoutlab.nn.conv_config import default_conv_plan

    class One(nnx.Module):
        def __init__(self):
            self.conv = nn.Conv(
                64, 64, 3, algorithm="auto", policy=get_policy("mixed_bf16"), rngs=nnx.Rngs(0)
            )

        def __call__(self, x):
            return self.conv(x)

    x = jax.ShapeDtypeStruct((32, 16, 16, 64), "float32")
    kinds = ("avx512_bf16", "avx512", "other")
    plans = {kind: default_conv_plan(One(), x, "train", kind) for kind in kinds}
    assert plans["avx512_bf16"]["conv"].algorithm == BF16_CHOICES["train", 32]
    assert plans["avx512_bf16"]["conv"].compute_dtype is None
    assert plans["other"]["conv"] == ("xla", plans["other"]["conv"].spec_key, None)
    # Without bf16 units: the float32 rule, on operands widened to float32.
    assert plans["avx512"]["conv"].compute_dtype == "float32"
