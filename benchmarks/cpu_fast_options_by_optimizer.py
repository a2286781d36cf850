"""Which YNNPACK fusions a CPU training step should get, per optimizer and batch size.

Times ResNet-18 CIFAR training steps (NHWC, fp32, the shipped conv table, HWIO kernels)
compiled with ``xla_cpu_experimental_ynn_fusion_type`` = dots + reductions, with and
without elementwise fusions (ELTWISE), for AdamW (``layoutlab train``'s optimizer) and SGD
with momentum (what ``bench --torch`` runs), interleaved per batch size with the bench's
own timer (``bench.sweep.run_group``).

    python benchmarks/cpu_fast_options_by_optimizer.py --batch-sizes 1,8,32,128 \
        --out benchmarks/results/cpu_fast_options_by_optimizer_avx512_cpu
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from layoutlab.bench.cases import JaxCase, make_workload
from layoutlab.bench.jax_runner import JaxRunner
from layoutlab.bench.machine import finish_machine_info, machine_info
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


def run(batches: list[int], budget: float) -> list[dict]:
    rows = []
    for batch in batches:
        w = make_workload("resnet18", {"stem": "cifar"}, (32, 32, 3), 10, "train", batch)
        runners = [
            JaxRunner(
                JaxCase(
                    w,
                    "NHWC",
                    "fp32",
                    "auto",
                    "channels_last",
                    ((KEY, value),),
                    f"{optimizer}:{name}",
                    conv_tune="never",
                    activation_storage="channels_last",
                    optimizer=optimizer,
                ),  # fmt: skip
                backend="cpu",
                steps=20,
            )
            for optimizer in OPTIMIZERS
            for name, value in SETS.items()
        ]
        for row in run_group(runners, repeats="auto", warmup=3, budget_s=budget, log=print):
            optimizer, name = row["defaults"].split(":")  # the label carries both
            rows.append({"optimizer": optimizer, "options": name, **{k: row.get(k) for k in KEEP}})
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| batch | optimizer | dot+reduce ms [95%] | +eltwise ms [95%] | eltwise / without |",
        "|---|---|---|---|---|",
    ]
    for batch in sorted({r["batch_size"] for r in rows}):
        for opt, label in OPTIMIZERS.items():
            a, b = (
                next(
                    r
                    for r in rows
                    if r["batch_size"] == batch and r["optimizer"] == opt and r["options"] == name
                )  # fmt: skip
                for name in SETS
            )
            cell = lambda r: (
                f"{r['step_ms_median']:.1f} [{r['step_ms_ci_low']:.1f}, {r['step_ms_ci_high']:.1f}]"
            )
            ratio = b["step_ms_median"] / a["step_ms_median"]
            lines.append(f"| {batch} | {label} | {cell(a)} | {cell(b)} | {ratio:.2f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-sizes", default="1,8,32,128")
    p.add_argument("--time-budget", type=float, default=20.0, help="seconds of rounds per batch")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    machine = machine_info("cpu", note="cpu_fast_options_by_optimizer")
    rows = run([int(b) for b in args.batch_sizes.split(",")], args.time_budget)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"machine": finish_machine_info(machine), "rows": rows}
    (out / "results.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
