"""A whole step with the shipped conv table against the same table without some rules, or
with candidate rules added.

    python benchmarks/ab_table_rules.py --model resnet18 --batch 8 --drop small
    python benchmarks/ab_table_rules.py --model resnet50 --batch 16 --drop 1x1s1
    python benchmarks/ab_table_rules.py --model resnet50 --batch 16 --drop mid --mode infer
    python benchmarks/ab_table_rules.py --batch 32 --drop overrides
    python benchmarks/ab_table_rules.py --batch 32 --add 4x4_xla,4x4_im2col

A conv algorithm that wins on its own (``layoutlab autotune convs``) need not make the whole
step faster: XLA:CPU overlaps a step's convs on the cores, and the conv's neighbours change.
This times the two programs interleaved (``bench.sweep.run_group``, NHWC, fp32, SGD with
momentum, the step's own compile options) and prints each median and the per-round ratio
``without / table`` (above 1: the rules make the step faster). The second program is set up
with the dropped rules removed from this CPU kind's table for the time of its set-up.

``--drop``: ``small`` every rule of the training table that holds below batch 128 (the table
before per-batch rules on this kind, but the tiny-input one), ``1x1s1`` the 1x1 stride-1
rule, ``mid`` the 7x7-28x28 Winograd rule, ``b1_7x7`` im2col on the 3x3 stride-1 convs up
to 7x7 at batch 1, ``b1_s2`` im2col on the 3x3 stride-2 convs up to 28x28 at batch 1,
``phase`` the stride-phase input gradient (``phase_dx``) on 3x3 stride-2 convs,
``4x4_512`` im2col on the 3x3 stride-1 convs of 512+ channels at 4x4 and below (up to batch
32; without it Winograd takes them at 32, XLA's conv at 9-31), ``depthwise`` the shifted
multiply-adds on 3x3 depthwise convs (``--model mobilenet_v2``), ``stem`` im2col on the
3-channel stem (``--model unet``, ``--model unet:width=64``), ``winograd_small`` Winograd on the
3x3 stride-1 convs of 128+ channels at 16x16 and below, ``stem7x7`` the oneDNN rules on the
7x7 stride-2 ImageNet stem (``--model resnet50``), ``all`` every rule (XLA's convs),
``overrides`` and ``widened_inference`` the table settings of ``PATCHES``.
``--add`` times instead one program per candidate (``ADDS``), its rules in front of the
AVX-512 float32 table of the mode, and prints ``candidate / table`` (below 1: the candidate
is faster); only where that table is the one read (an AVX-512 CPU, a float32 policy).
``--precision mixed_bf16`` times both programs under that policy (the bf16 table).
"""

from __future__ import annotations

import argparse

from interleaved_steps import bench_options, run_ab, runner, with_rules, workload

from layoutlab.bench.jax_runner import JaxRunner
from layoutlab.fast_defaults import table_cpu_kind
from layoutlab.nn.conv_algos import default_plan
from layoutlab.nn.conv_algos.default_plan import Rule
from layoutlab.precision import get_policy

DROPS = {
    "small": lambda r: r.min_batch < 128 and r.max_size != 2,
    "1x1s1": lambda r: r.kernel == (1, 1) and r.strides == (1, 1),
    "mid": lambda r: r.max_size == 28,
    "b1_7x7": lambda r: r.max_batch == 1 and r.max_size == 7,
    "b1_s2": lambda r: r.max_batch == 1 and r.strides == (2, 2) and r.max_size == 28,
    "phase": lambda r: r.algorithm == "phase_dx",
    "4x4_512": lambda r: r.algorithm == "im2col" and r.max_size == 4 and r.min_in == 512,
    "depthwise": lambda r: r.depthwise,
    "stem": lambda r: r.algorithm == "im2col" and r.max_in == 4,
    "winograd_small": lambda r: r.algorithm.startswith("winograd") and r.max_size == 16,
    "stem7x7": lambda r: r.kernel == (7, 7),
    "all": lambda r: True,
}


# Candidate rules put in front of the AVX-512 float32 table of the run's mode (``--add``).
# ``deep_xla_dw``: XLA's weight gradient (oneDNN's forward and input gradient) on ResNet-18
# CIFAR's 16x16 and 8x8 stride-2 3x3 convs and its 4x4 512-channel ones, from batch 16 where
# the training table's oneDNN rule starts; ``deep_xla``: the same, but XLA's conv in all three
# passes on the 4x4 ones; ``4x4_*``: only the 4x4 ones, on XLA's conv, im2col or Winograd
# (``4x4_xla_b1`` from batch 1, for inference).
_S2_DW = Rule("onednn_xla_dw", (3, 3), (2, 2), min_in=128, max_in=256, max_size=16, min_batch=16)


def _deep(algorithm, min_batch=16):
    return Rule(algorithm, (3, 3), (1, 1), min_in=512, max_size=4, min_batch=min_batch)


ADDS = {
    "deep_xla_dw": (_deep("onednn_xla_dw"), _S2_DW),
    "deep_xla": (_deep("xla"), _S2_DW),
    "4x4_xla": (_deep("xla"),),
    "4x4_xla_b1": (_deep("xla", 1),),
    "4x4_xla_b8": (_deep("xla", 8),),
    "4x4_im2col": (_deep("im2col"),),
    "4x4_winograd": (_deep("winograd4_full"),),
    # ResNet-50's layer4 3x3 convs (7x7 512-channel, and the 14x14 stride-2 one) too.
    "512_xla": (
        Rule("xla", (3, 3), (1, 1), min_in=512, max_size=7, min_batch=16),
        Rule("xla", (3, 3), (2, 2), min_in=512, max_size=14, min_batch=16),
    ),
    "512_xla_b1": (
        Rule("xla", (3, 3), (1, 1), min_in=512, max_size=7),
        Rule("xla", (3, 3), (2, 2), min_in=512, max_size=14),
    ),
}


def _add_key(mode):
    return ("avx512", "train" if mode == "train" else "inference", "float32")


def _with(add, mode):
    key = _add_key(mode)
    return with_rules({key: (*add, *default_plan.DEFAULT_RULES[key])})


def _patched(name, value):
    """A ``JaxRunner`` whose set-up reads ``default_plan.<name>`` as ``value``."""

    class Patched(JaxRunner):
        def setup(self):
            saved = getattr(default_plan, name)
            setattr(default_plan, name, value)
            try:
                return super().setup()
            finally:
                setattr(default_plan, name, saved)

    return Patched


# ``--drop`` choices that patch a table setting: ``overrides`` the kind's ``ONEDNN_OVERRIDES``
# (oneDNN back on the convs they take); ``widened_inference`` the exception that keeps widened
# inference convs off them (``WIDENED_OVERRIDDEN``: the overrides then hold there too).
PATCHES = {
    "overrides": ("ONEDNN_OVERRIDES", {}),
    "widened_inference": ("WIDENED_OVERRIDDEN", ("train", "inference")),
}


def _without(drop):
    if drop in PATCHES:
        return _patched(*PATCHES[drop])
    return with_rules({
        key: tuple(r for r in rules if not drop(r))
        for key, rules in default_plan.DEFAULT_RULES.items()
    })  # fmt: skip


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18", help="resnet18 (CIFAR, 32x32) or resnet50")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--mode", default="train", choices=("train", "infer"))
    p.add_argument("--drop", default="small", choices=sorted([*DROPS, *PATCHES]))
    p.add_argument("--add", help=f"comma-separated, of: {', '.join(ADDS)}; instead of --drop")
    p.add_argument("--precision", default="fp32", help="a policy name: fp32 or mixed_bf16")
    p.add_argument("--time-budget", type=float, default=30.0)
    args = p.parse_args(argv)
    w = workload(args.model, args.mode, args.batch)
    opts = bench_options(w, precision=args.precision)
    adds = args.add.split(",") if args.add else []
    if unknown := [a for a in adds if a not in ADDS]:
        p.error(f"unknown --add {', '.join(unknown)}: choose from {', '.join(ADDS)}")
    kind, dtype = table_cpu_kind("cpu"), str(get_policy(args.precision).compute_dtype)
    if dtype == "bfloat16" and kind in default_plan.WIDEN_KINDS:
        dtype = "float32"  # its convs widened: they read the float32 rules
    read = default_plan.table_key(kind, _add_key(args.mode)[1], dtype)
    if adds and read != _add_key(args.mode):
        p.error(f"--add changes the table {_add_key(args.mode)}, but this run reads {read}")
    drop = args.drop if args.drop in PATCHES else DROPS[args.drop]
    others = [(_with(ADDS[a], args.mode), a) for a in adds] or [(_without(drop), "without")]
    runners = [
        runner(w, label, opts, cls=cls, precision=args.precision)
        for cls, label in ((JaxRunner, "table"), *others)
    ]
    change = f"--add {args.add}" if args.add else f"--drop {args.drop}"
    what = f"{args.model} {args.mode} b{args.batch} {args.precision} {change}"
    run_ab(runners, what, "table", args.time_budget)


if __name__ == "__main__":
    main()
