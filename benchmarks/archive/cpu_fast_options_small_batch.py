"""A small-batch CPU training step with and without the XLA:CPU options of ``--cpu-fast``.

    python benchmarks/archive/cpu_fast_options_small_batch.py --batch-sizes 1 --optimizer pytorch
    python benchmarks/archive/cpu_fast_options_small_batch.py --batch-sizes 8,32 --time-budget 30
    python benchmarks/archive/cpu_fast_options_small_batch.py --batch-sizes 1 --optimizer train

ResNet-18 CIFAR (or ``--model resnet50``: ImageNet stem at 224x224) training steps (NHWC,
fp32, HWIO kernels), interleaved per batch size with
the bench's own timer (``bench.sweep.run_group``): the shipped conv table (``auto``, no
tuning) compiled with YNNPACK's dot, reduction and elementwise fusions (the SGD default),
without the elementwise ones (the AdamW default on AVX-512), with no options (XLA's own
defaults, convs on YNNPACK too) and with convs added; and XLA's convs with no options. One
line per case: median step ms with its 95% interval. ``--optimizer``: ``pytorch`` (SGD with
momentum, what ``bench --torch`` runs) or ``train`` (``layoutlab train``'s AdamW).
"""

from __future__ import annotations

import argparse

from interleaved_steps import median_cell, runner, workload

from layoutlab.bench.sweep import run_group

_Y = "LIBRARY_FUSION_TYPE_"
KEY = "xla_cpu_experimental_ynn_fusion_type"
SETS = {
    "table+dot+reduce+eltwise": ("auto", f"{_Y}INDIVIDUAL_DOT,{_Y}REDUCE,{_Y}ELTWISE"),
    "table+dot+reduce": ("auto", f"{_Y}INDIVIDUAL_DOT,{_Y}REDUCE"),
    "table+no-options": ("auto", None),
    "xla+no-options": ("xla", None),
    "table+dot+reduce+eltwise+conv": (
        "auto", f"{_Y}INDIVIDUAL_DOT,{_Y}REDUCE,{_Y}ELTWISE,{_Y}INDIVIDUAL_CONVOLUTION"
    ),
}  # fmt: skip


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-sizes", default="1")
    p.add_argument("--time-budget", type=float, default=25.0, help="seconds of rounds per batch")
    p.add_argument("--optimizer", default="pytorch", choices=("pytorch", "train"))
    p.add_argument("--model", default="resnet18", help="resnet18 (CIFAR stem, 32x32) or resnet50")
    args = p.parse_args(argv)
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        w = workload(args.model, "train", batch)
        runners = [
            runner(
                w, name, {} if value is None else {KEY: value}, optimizer=args.optimizer, algo=algo
            )  # fmt: skip
            for name, (algo, value) in SETS.items()
        ]
        for row in run_group(runners, repeats="auto", warmup=3, budget_s=args.time_budget):
            print(batch, args.optimizer, row["defaults"], row["status"], median_cell(row),
                  row.get("unstable_reason") or "", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
