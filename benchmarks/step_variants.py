"""Whole steps with another CPU kind's conv table, other XLA:CPU options or added rules,
PyTorch eager beside them, interleaved.

    python benchmarks/step_variants.py --model resnet18 --mode train --batch 1 \
        --variants table,table@avx2,table+b1_avx2,torch
    python benchmarks/step_variants.py --model resnet50 --mode train --batch 1 \
        --variants table,table+b1_avx2,table@avx2,torch --out DIR

For a CPU whose kind (``fast_defaults.cpu_kind``) shares a table with another generation:
does the other kind's table, or one of its rules, fit this one better? A variant is
``table`` (this kind's shipped table), ``table@KIND`` (KIND's rules in place of this kind's
for the step's objective), ``table+EXTRA`` (this kind's rules with ``EXTRA``'s in front),
any registered algorithm name for every conv (``xla``, ``im2col``, ...), each with an
optional ``:OPTIONS``: ``base`` (default: the options ``bench`` gives the step on this CPU),
``k=KIND`` (those ``bench`` would give it on a CPU of KIND), ``none``, or YNNPACK fusion
kinds joined by ``+`` (``dot``, ``red``, ``elt``, ``conv``); and ``torch`` (PyTorch eager,
channels_last). NHWC, fp32, SGD with momentum (``interleaved_steps``), the bench's timer
(``bench.sweep.run_group``). Prints each median with its interval and the per-round ratio
``variant / first`` of step times (above 1: the first variant is faster); ``--out`` saves
``step_variants_<model>_<mode>_b<batch>.json``. ``--keep-host-memory one`` or ``per_thread``
keeps host memory as ``layoutlab bench`` would for that batch; without it a large step
page-faults its temp buffer on every call.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from interleaved_steps import bench_options, median_cell, runner, with_rules, workload

import layoutlab.fast_defaults as fast_defaults
from layoutlab.bench.cases import TorchCase
from layoutlab.bench.jax_runner import JaxRunner
from layoutlab.bench.machine import finish_machine_info, machine_info
from layoutlab.bench.stats import paired_ratio
from layoutlab.bench.sweep import run_group
from layoutlab.nn.conv_algos import default_plan
from layoutlab.nn.conv_algos.default_plan import Rule

_KEY = "xla_cpu_experimental_ynn_fusion_type"
_FUSIONS = {"dot": "INDIVIDUAL_DOT", "red": "REDUCE", "elt": "ELTWISE",
            "conv": "INDIVIDUAL_CONVOLUTION"}  # fmt: skip
# The AVX-512 training table's wide rule: all three Winograd passes on 256+-channel 3x3
# convs at 7x7-14x14, batch 8 to 31. The variants below reuse its bounds.
_WIDE = next(
    r for r in default_plan.DEFAULT_RULES[("avx512", "train", "float32")]
    if r.algorithm == "winograd4_full" and r.min_in == 256
)  # fmt: skip
# Rules put in front of this kind's. b1_avx2: the two batch-1 training rules of the AVX2
# table that the AVX-512 one lacks (Winograd on ResNet-18 CIFAR's 32x32x64 and 16x16x128
# convs, gemm_dw on its 8x8x256 ones); b1_stages: the first alone.
EXTRA = {
    "b1_avx2": (
        Rule("winograd4_full", (3, 3), (1, 1), min_in=64, max_in=128, min_size=16, max_size=32,
             max_batch=1),
        Rule("gemm_dw", (3, 3), (1, 1), min_in=256, max_in=256, min_size=8, max_size=8,
             max_batch=1),
    ),
    # Batch-8 inference: what `autotune convs` chose one conv at a time on Zen 4 (Winograd on
    # the 32x32x64, 16x16x128 and 4x4x512 convs), and the 16x16x128 one alone.
    "i8_tuned": (
        Rule("winograd4_full", (3, 3), (1, 1), min_in=64, max_in=128, min_size=16, max_size=32),
        Rule("winograd2", (3, 3), (1, 1), min_in=512, max_size=4),
    ),
    "i8_16x16": (Rule("winograd4_full", (3, 3), (1, 1), min_in=128, max_in=128, min_size=16,
                      max_size=16),),
    # The AVX2 table's training rule on ResNet-50's 14x14x256 and 7x7x512 convs and ResNet-18
    # CIFAR's 8x8x256 ones (all three passes by Winograd), from batch 8 up to where this
    # kind's own Winograd rule starts (32); wide14: the 14x14 convs only. The AVX-512 table
    # holds it since it was measured, so no_wide (XLA's conv in front) is the table before.
    "wide": (_WIDE,),
    "no_wide": (_WIDE._replace(algorithm="xla"),),
    "wide14": (_WIDE._replace(min_size=14),),
    "b1_stages": (
        Rule("winograd4_full", (3, 3), (1, 1), min_in=64, max_in=128, min_size=16, max_size=32,
             max_batch=1),
    ),
}  # fmt: skip


def _options(w, spec: str) -> dict:
    if spec in ("", "base"):
        return bench_options(w)
    if spec == "none":
        return {}
    if spec.startswith("k="):
        saved = fast_defaults.cpu_kind
        fast_defaults.cpu_kind = lambda: spec[2:]  # what bench would pick on that kind
        try:
            return bench_options(w)
        finally:
            fast_defaults.cpu_kind = saved
    kinds = ",".join(f"LIBRARY_FUSION_TYPE_{_FUSIONS[k]}" for k in spec.split("+"))
    return {_KEY: kinds}


def _runner(w, variant: str, objective: str):
    if variant == "torch":
        from layoutlab.bench.torch_runner import TorchRunner

        return TorchRunner(TorchCase(w, "channels_last", "fp32"))
    head, _, spec = variant.partition(":")
    head, _, kind = head.partition("@")
    head, _, extra = head.partition("+")
    key = (fast_defaults.cpu_kind(), objective, "float32")
    rules = default_plan.DEFAULT_RULES.get(key, ())
    if kind:
        rules = default_plan.DEFAULT_RULES[(kind, objective, "float32")]
    if extra:
        rules = (*EXTRA[extra], *rules)
    cls = with_rules({key: rules}) if kind or extra else JaxRunner
    algo = "auto" if head == "table" else head
    return runner(w, variant, _options(w, spec), algo=algo, cls=cls)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18", help="resnet18 (CIFAR, 32x32) or resnet50")
    p.add_argument("--mode", default="train", choices=("train", "infer"))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--variants", default="table,torch")
    p.add_argument("--time-budget", type=float, default=45.0)
    p.add_argument("--out")
    p.add_argument(
        "--keep-host-memory", choices=("one", "per_thread"),
        help="keep host memory as `layoutlab bench` does (one arena from 32,768 input pixels "
        "per batch, per-thread arenas below); default: glibc's malloc",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.keep_host_memory:  # before anything starts JAX's backend
        from layoutlab.host import keep_host_memory

        keep_host_memory(args.keep_host_memory)
    w = workload(args.model, args.mode, args.batch)
    objective = "train" if args.mode == "train" else "inference"
    names = args.variants.split(",")
    machine = machine_info("cpu")
    runners = [_runner(w, name, objective) for name in names]
    rows = run_group(runners, repeats="auto", warmup=2, budget_s=args.time_budget)
    first = json.loads(rows[0]["round_ms"]) if rows[0]["status"] == "ok" else None
    for name, row in zip(names, rows, strict=True):
        ratio = None
        if first is not None and row["status"] == "ok" and row is not rows[0]:
            ratio = paired_ratio(json.loads(row["round_ms"]), first)
            row["ratio_vs_first"] = list(ratio)
        print(fast_defaults.cpu_kind(), args.model, args.mode, args.batch, name, row["status"],
              median_cell(row), f"{name} / {names[0]}: " + (
                  f"{ratio.value:.3f} [{ratio.low:.3f}, {ratio.high:.3f}]" if ratio else "-"),
              flush=True)  # fmt: skip
    if args.out:
        path = Path(args.out) / f"step_variants_{args.model}_{args.mode}_b{args.batch}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        result = {"machine": finish_machine_info(machine), "variants": names, "rows": rows}
        path.write_text(json.dumps(result, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
