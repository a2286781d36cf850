"""Which YNNPACK fusions a CPU training step should get, per model, optimizer and batch size.

Times training steps (NHWC, fp32, the shipped conv table, HWIO kernels) compiled with
``xla_cpu_experimental_ynn_fusion_type`` = dots + reductions, with and without elementwise
fusions (ELTWISE), for AdamW (``layoutlab train``'s optimizer) and SGD with momentum (what
``bench --torch`` runs), interleaved per model and batch size with the bench's own timer
(``bench.sweep.run_group``). Models: ``interleaved_steps.workload`` (ResNet-18 CIFAR,
ResNet-50 ImageNet, any other at its default input).

    python benchmarks/archive/cpu_fast_options_by_optimizer.py --batch-sizes 1,8,32,128 \
        --out benchmarks/results/cpu_fast_options_by_optimizer_avx512_cpu
    python benchmarks/archive/cpu_fast_options_by_optimizer.py --models unet,mobilenet_v2 \
        --batch-sizes 8,32 --optimizers pytorch --out DIR
"""

from __future__ import annotations

import argparse
import json

from interleaved_steps import save_results, workload

from layoutlab.bench.cases import JaxCase
from layoutlab.bench.jax_runner import JaxRunner
from layoutlab.bench.machine import machine_info
from layoutlab.bench.stats import paired_ratio
from layoutlab.bench.sweep import run_group

_Y = "LIBRARY_FUSION_TYPE_"
KEY = "xla_cpu_experimental_ynn_fusion_type"
SETS = {
    "dot+reduce": f"{_Y}INDIVIDUAL_DOT,{_Y}REDUCE",
    "dot+reduce+eltwise": f"{_Y}INDIVIDUAL_DOT,{_Y}REDUCE,{_Y}ELTWISE",
}
KEEP = (
    "batch_size",
    "step_ms_median",
    "step_ms_ci_low",
    "step_ms_ci_high",
    "dispersion",
    "other_cores",
    "unstable_reason",
    "status",
    "round_ms",
)
OPTIMIZERS = {"train": "AdamW (layoutlab train)", "pytorch": "SGD, momentum 0.9"}


def run(models: list[str], batches: list[int], optimizers: list[str], budget: float) -> list[dict]:
    rows = []
    for model, batch in ((m, b) for m in models for b in batches):
        w = workload(model, "train", batch)
        runners = [
            JaxRunner(
                JaxCase.of(
                    w,
                    optimizer,
                    layout="NHWC",
                    conv_algorithm="auto",
                    kernel_storage="channels_last",
                    activation_storage="channels_last",
                    xla_options={KEY: value},
                    defaults=f"{optimizer}:{name}",
                    conv_tune="never",
                ),
                backend="cpu",
                steps=20,
            )
            for optimizer in optimizers
            for name, value in SETS.items()
        ]
        for row in run_group(runners, repeats="auto", warmup=3, budget_s=budget, log=print):
            optimizer, name = row["defaults"].split(":")  # the label carries both
            rows.append({"model": model, "optimizer": optimizer, "options": name,
                         **{k: row.get(k) for k in KEEP}})  # fmt: skip
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| model | batch | optimizer | dot+reduce ms [95%] | +eltwise ms [95%] "
        "| eltwise / without, per round [95%] |",
        "|---|---|---|---|---|---|",
    ]

    def cell(r):
        return f"{r['step_ms_median']:.1f} [{r['step_ms_ci_low']:.1f}, {r['step_ms_ci_high']:.1f}]"

    cases = dict.fromkeys((r["model"], r["batch_size"], r["optimizer"]) for r in rows)
    for model, batch, opt in cases:
        pair = [next(r for r in rows if (r["model"], r["batch_size"], r["optimizer"], r["options"])
                     == (model, batch, opt, name)) for name in SETS]  # fmt: skip
        if any(r["status"] != "ok" for r in pair):
            lines.append(f"| {model} | {batch} | {OPTIMIZERS[opt]} | {pair[0]['status']} "
                         f"| {pair[1]['status']} | - |")  # fmt: skip
            continue
        without, eltwise = (json.loads(r["round_ms"]) for r in pair)
        ci = paired_ratio(eltwise, without)
        ratio = f"{ci.value:.2f} [{ci.low:.2f}, {ci.high:.2f}]"
        lines.append(f"| {model} | {batch} | {OPTIMIZERS[opt]} | {cell(pair[0])} | {cell(pair[1])} "
                     f"| {ratio} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="resnet18")
    p.add_argument("--batch-sizes", default="1,8,32,128")
    p.add_argument("--optimizers", default=",".join(OPTIMIZERS), help="train and/or pytorch")
    p.add_argument("--time-budget", type=float, default=20.0, help="seconds of rounds per batch")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    machine = machine_info("cpu", note="cpu_fast_options_by_optimizer")
    rows = run(args.models.split(","), [int(b) for b in args.batch_sizes.split(",")],
               args.optimizers.split(","), args.time_budget)  # fmt: skip
    save_results(args.out, machine, rows)
    print(markdown(rows))


if __name__ == "__main__":
    main()
