"""The AVX2 training table before its small-batch rules against the shipped one, whole steps;
inference tables too.

    python benchmarks/archive/ab_avx2_train_table.py --model resnet18 --batch 1 \
        --cases before+eltwise,shipped+eltwise,shipped,no_phase
    python benchmarks/archive/ab_avx2_train_table.py --model resnet50 --batch 16 \
        --cases before,shipped,no_phase --time-budget 90
    python benchmarks/archive/ab_avx2_train_table.py --model mobilenet_v2 --batch 8 \
        --cases no_depthwise,shipped
    python benchmarks/archive/ab_avx2_train_table.py --model resnet50 --batch 16 --mode infer \
        --cases before,shipped --time-budget 120

Each case is one step (training by default: NHWC, fp32, SGD with momentum, HWIO kernels;
the ``interleaved_steps`` runner) whose ``("avx2", "train", "float32")`` rules are swapped
for the case's while it is set up; the cases run interleaved round by round
(``bench.sweep.run_group``). Tables: ``before`` (the rules as they were until the batch-1
measurements of ``benchmarks/results/train_table_small_batch_avx2_cpu.md``), ``shipped``,
the shipped table without Winograd on ResNet-50's 14x14 and 7x7 stage convs and
ResNet-18's 8x8x256 ones (``no_wide``) or with it at any batch (``mid_dw``: forward and
input gradient; ``mid_full``: all three), without its ``phase_dx`` rule (``no_phase``),
without Winograd on the stage convs (``no_stages``), without the depthwise rules
(``no_depthwise``) or without ``gemm_dw`` on the 8x8x256 convs at batch 1
(``no_gemm_dw``), and with it on the 14x14x256 ones too (``gemm_dw14``); between batch 65
and 127, the batch-128 Winograd rule from 65 (``small65``), the batch 8-64 one up to 127
(``wide127``), or both (``both65``).
``--mode infer`` swaps the ``("avx2", "inference", "float32")`` rules instead: ``before``
(Winograd from batch 32 on 8x8-16x16 inputs, until
``benchmarks/results/conv_autotune_infer_avx2_cpu.md``), ``shipped`` (from 16 on 7x7-28x28
inputs), ``mid8`` (the same from 8), ``no_depthwise``. Each case
gets ``cpu_fast_options`` for its batch and largest conv output on this CPU; a ``+eltwise``
or ``-eltwise`` suffix compiles it with or without YNNPACK's elementwise fusions instead
(``before+eltwise`` is a small step as it ran before both changes). One
line per case: median step ms with its interval and the per-round ratio ``first case /
this case`` (above 1: this case is faster). Run on an AVX2 CPU: elsewhere the table swapped
here is not the one the step reads.
"""

from __future__ import annotations

import argparse
import json

from interleaved_steps import bench_options, median_cell, runner, with_rules, workload

from layoutlab.bench.stats import paired_ratio
from layoutlab.bench.sweep import run_group
from layoutlab.fast_defaults import cpu_kind
from layoutlab.nn.conv_algos import default_plan as plan

KEYS = {"train": ("avx2", "train", "float32"), "infer": ("avx2", "inference", "float32")}
_BEFORE = (
    plan.Rule("im2col", (3, 3), (1, 1), max_size=2),
    plan.Rule("im2col", (3, 3), (2, 2), max_size=2),
    plan.Rule("winograd4_xla_dw", (3, 3), (1, 1), min_in=128, max_size=16, min_batch=128),
    plan.Rule("im2col", (1, 1), (2, 2), max_in=128, min_size=16),
)


_TINY = plan._TINY_INPUT


def _tables(mode: str) -> dict:
    shipped = plan.DEFAULT_RULES[KEYS[mode]]

    def without(algorithm, **fields):
        return tuple(
            r for r in shipped
            if not (r.algorithm == algorithm and all(getattr(r, k) == v for k, v in fields.items()))
        )  # fmt: skip

    if mode == "infer":
        # ``before``: the inference rules until conv_autotune_infer_avx2_cpu.md, Winograd from
        # 32 on 8x8-16x16 inputs; ``mid8``: the shipped rule from batch 8.
        rest = tuple(r for r in shipped if not r.algorithm.startswith("winograd"))
        small = plan._WINOGRAD_SMALL
        late = plan.Rule("winograd4_xla_dw", **small, min_batch=128)
        early = plan.Rule("winograd4_xla_dw", **plan._WINOGRAD_MID, min_batch=8)
        return {
            "before": (*rest, plan.Rule("winograd4_xla_dw", **{**small, "min_size": 8},
                                        min_batch=32), late),
            "shipped": shipped,
            "mid8": (early, *rest, late),
            "no_depthwise": without("depthwise"),
        }  # fmt: skip
    gemm_dw14 = plan.Rule("gemm_dw", (3, 3), (1, 1), min_in=256, max_in=256, min_size=8,
                          max_size=14, max_batch=1)  # fmt: skip
    # Winograd on ResNet-50's 14x14x256 and 7x7x512 convs and ResNet-18 CIFAR's 8x8x256 ones
    # (``_WINOGRAD_WIDE``, shipped at batch 8-64), forward and input gradient (``mid_dw``) or
    # all three passes (``mid_full``) at whatever batch the run has, or none (``no_wide``:
    # the shipped table before it; the runs that led to the rule called it ``shipped``).
    no_wide = without("winograd4_full", min_in=256)
    wide = plan._WINOGRAD_WIDE
    return {
        "before": _BEFORE,
        "shipped": shipped,
        "no_wide": no_wide,
        "mid_dw": (*_TINY, plan.Rule("winograd4_xla_dw", **wide), *no_wide[len(_TINY) :]),
        "mid_full": (*_TINY, plan.Rule("winograd4_full", **wide), *no_wide[len(_TINY) :]),
        "no_phase": without("phase_dx"),
        "no_stages": without("winograd4_full", min_in=64),
        "no_depthwise": without("depthwise"),
        "no_gemm_dw": without("gemm_dw"),
        # The gemm_dw rule as first tried: 8x8 and 14x14 (ResNet-50's convs) at batch 1.
        "gemm_dw14": (gemm_dw14, *without("gemm_dw")),
        # Batch 65-127, where no Winograd rule holds: the batch-128 rule from 65
        # (``small65``), the batch 8-64 wide rule up to 127 (``wide127``), or both.
        "small65": _rebatched(shipped, small65=True),
        "wide127": _rebatched(shipped, wide127=True),
        "both65": _rebatched(shipped, small65=True, wide127=True),
    }


def _rebatched(rules, *, small65=False, wide127=False):
    def matches(r, algorithm, shape):
        return r.algorithm == algorithm and all(getattr(r, k) == v for k, v in shape.items())

    def change(r):
        if small65 and matches(r, "winograd4_xla_dw", plan._WINOGRAD_SMALL):
            return r._replace(min_batch=65)
        if wide127 and matches(r, "winograd4_full", plan._WINOGRAD_WIDE):
            return r._replace(max_batch=127)
        return r

    return tuple(change(r) for r in rules)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18", help="resnet18 (CIFAR), resnet50 (ImageNet)...")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--mode", default="train", choices=sorted(KEYS))
    p.add_argument("--cases", default="before,shipped")
    p.add_argument("--time-budget", type=float, default=30.0)
    args = p.parse_args(argv)
    if cpu_kind() != "avx2":
        p.error(f"this CPU is {cpu_kind()}, not avx2: the swapped table would not be read")
    tables = _tables(args.mode)
    w = workload(args.model, args.mode, args.batch)
    opts = bench_options(w)
    key, eltwise = "xla_cpu_experimental_ynn_fusion_type", "LIBRARY_FUSION_TYPE_ELTWISE"
    kinds = [k for k in opts[key].split(",") if k != eltwise]
    options = {"": opts, "-": {**opts, key: ",".join(kinds)},
               "+": {**opts, key: ",".join([*kinds, eltwise])}}  # fmt: skip
    runners = []
    for case in args.cases.split(","):
        table, sign, rest = case.partition("+") if "+" in case else case.partition("-")
        if table not in tables or rest not in ("", "eltwise"):
            p.error(f"unknown case {case!r}: a table of {sorted(tables)}, optionally "
                    "+eltwise or -eltwise")  # fmt: skip
        swapped = with_rules({KEYS[args.mode]: tables[table]})
        runners.append(runner(w, case, options[sign], cls=swapped))
    rows = run_group(runners, repeats="auto", warmup=2, budget_s=args.time_budget)
    first = json.loads(rows[0]["round_ms"]) if rows[0]["status"] == "ok" else None
    for r in rows:
        ci = None
        if first is not None and r["status"] == "ok":
            ci = paired_ratio(first, json.loads(r["round_ms"]))
        cell = "-" if ci is None else f"{ci[0]:.3f} [{ci[1]:.3f}, {ci[2]:.3f}]"
        print(args.model, args.mode, args.batch, r["defaults"], r["status"], median_cell(r),
              "first/this", cell, r.get("error") or "", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
