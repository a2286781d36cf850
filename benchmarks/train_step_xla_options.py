"""XLA:CPU options on a whole ResNet-18 training step, A/B in the same rounds.

    python benchmarks/train_step_xla_options.py [--stem cifar] [--batch 128] [--layout NHWC]
        [--variants cpu_fast,no_eltwise,...] [--rounds 7] [--torch] [--tag cpu]
        [--precision fp32|mixed_bf16] [--conv-algo xla|auto|onednn] [--optimizer train|pytorch]
        [--note "..."] [--out benchmarks/results]

Every variant is ``layoutlab.xla.cpu_fast_options("train")`` plus (or minus) one change, so
each row answers "does this option help the step layoutlab's best configuration runs?".
Variants are compiled first, then timed round by round (A B C A B C ...) and the medians
kept, so they share the machine's load; ``--torch`` adds PyTorch eager (channels_last for
NHWC, contiguous for NCHW; autocast with ``--precision mixed_bf16``) to the rounds. Convs run
``--conv-algo`` (default XLA's native algorithm, ``xla``) with HWIO kernels, so the options are
the only difference.

Writes ``<out>/train_step_xla_options_<tag>.json`` (machine, versions, per-round times) and
``<out>/train_step_xla_options_<tag>.md``. About 6 minutes for the default variants on the
2-core VM (each compile takes 30-60 s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from layoutlab.bench.cases import JaxCase, TorchCase, make_workload
from layoutlab.bench.jax_runner import JaxRunner
from layoutlab.bench.machine import finish_machine_info, machine_info
from layoutlab.xla import cpu_fast_options

_YNN_KEY = "xla_cpu_experimental_ynn_fusion_type"
_YNN = "LIBRARY_FUSION_TYPE_"

# name -> (options merged over cpu_fast_options("train"), why it is worth a look)
VARIANTS = {
    "cpu_fast": ({}, "layoutlab's training options (--cpu-fast)"),
    "no_eltwise": (
        {_YNN_KEY: f"{_YNN}INDIVIDUAL_DOT,{_YNN}REDUCE"},
        "elementwise fusions on XLA's own loops instead of YNNPACK",
    ),
    "ynn_dot_reduce_eltwise": (
        {_YNN_KEY: f"{_YNN}INDIVIDUAL_DOT,{_YNN}REDUCE,{_YNN}ELTWISE"},
        "dots, reductions and elementwise fusions on YNNPACK (an SGD step's --cpu-fast)",
    ),
    "ynn_dot": (
        {_YNN_KEY: f"{_YNN}INDIVIDUAL_DOT"},
        "only dots on YNNPACK (inference's --cpu-fast)",
    ),
    "concurrency_scheduler": (
        {"xla_cpu_enable_concurrency_optimized_scheduler": True},
        "schedule for concurrent thunks",
    ),
    "memory_scheduler": (
        {"xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"},
        "schedule for a smaller temp buffer",
    ),
    "ftz": ({"xla_cpu_ftz": True}, "flush denormals to zero"),
    "eigen_single_thread": (
        {"xla_cpu_multi_thread_eigen": False},
        "Eigen convs single-threaded; independent thunks still run concurrently",
    ),
}


def options(name: str, optimizer: str = "train") -> tuple[tuple[str, object], ...]:
    extra, _ = VARIANTS[name]
    base = cpu_fast_options("train", optimizer=optimizer)
    return tuple(sorted({**base, **extra}.items()))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stem", choices=("cifar", "imagenet"), default="cifar")
    p.add_argument("--batch", type=int, default=None, help="default: 128 cifar, 16 imagenet")
    p.add_argument("--layout", default="NHWC")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--torch", action="store_true", help="add PyTorch eager to the rounds")
    p.add_argument("--precision", default="fp32", help="fp32 or mixed_bf16 (PyTorch: autocast)")
    p.add_argument("--conv-algo", default="xla", help="xla, auto (the shipped table), onednn, ...")
    p.add_argument(
        "--optimizer",
        default="train",
        choices=("train", "pytorch"),
        help="train: AdamW as `layoutlab train`; pytorch: SGD with momentum as bench --torch",
    )
    p.add_argument("--tag", default="cpu")
    p.add_argument("--note", default=None)
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")

    size, classes = (32, 10) if args.stem == "cifar" else (224, 1000)
    batch = args.batch or (128 if args.stem == "cifar" else 16)
    workload = make_workload(
        "resnet18", {"stem": args.stem}, (size, size, 3), classes, "train", batch
    )
    machine = machine_info(note=args.note)
    runners, temp_bytes = {}, {}
    for name in names:
        case = JaxCase.of(
            workload,
            args.optimizer,
            layout=args.layout,
            precision=args.precision,
            conv_algorithm=args.conv_algo,
            kernel_storage="channels_last",
            activation_storage="channels_last",
            xla_options=options(name, args.optimizer),
            conv_tune="never",
        )
        runner = JaxRunner(case)
        temp_bytes[name] = runner.setup().get("temp_bytes")
        runner.step()  # warm-up, outside the rounds
        runners[name] = runner
        print(f"compiled {name}", file=sys.stderr, flush=True)
    if args.torch:
        from layoutlab.bench.torch_runner import TorchRunner

        fmt = "channels_last" if args.layout == "NHWC" else "contiguous"
        torch_precision = "fp32" if args.precision == "fp32" else "amp_bf16"
        runner = TorchRunner(TorchCase(workload, fmt, torch_precision), device="cpu")
        runner.setup()
        runner.step()
        runners[f"torch_{fmt}"] = runner

    # Each runner's step blocks until its result is ready (JaxRunner syncs), so the clock
    # reads whole steps.
    times = {name: [] for name in runners}
    for _ in range(args.rounds):
        for name, runner in runners.items():
            start = time.perf_counter()
            runner.step()
            times[name].append(time.perf_counter() - start)

    base = statistics.median(times[names[0]])
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append(
            {
                "variant": name,
                "options": dict(options(name, args.optimizer)) if name in VARIANTS else None,
                "why": VARIANTS[name][1] if name in VARIANTS else "PyTorch eager",
                "temp_bytes": temp_bytes.get(name),
                "step_ms_median": 1e3 * med,
                "step_ms_min": 1e3 * min(ts),
                "step_ms_rounds": [1e3 * t for t in ts],
                "speed_vs_first": base / med,
            }
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"train_step_xla_options_{args.tag}"
    record = {
        "machine": finish_machine_info(machine),
        "workload": {"model": "resnet18", "stem": args.stem, "batch": batch, "layout": args.layout},
        "rounds": args.rounds,
        "rows": rows,
    }
    (out / f"{stem}.json").write_text(json.dumps(record, indent=1) + "\n")
    m = record["machine"]
    lines = [
        f"# XLA:CPU options on a ResNet-18 training step ({args.stem} stem, batch {batch}, "
        f"{args.layout}, {args.precision}, {args.conv_algo} convs, {args.optimizer} optimizer)",
        "",
        f"Machine: {m['cpu_model']}, {m['usable_cores']} usable cores; "
        f"jax {m['versions'].get('jax')}, torch {m['versions'].get('torch')}. Load average "
        f"{m['load_average']} at start, {m['load_average_end']} at end. {m.get('note') or ''}",
        "",
        f"Medians of {args.rounds} interleaved rounds. Each variant is "
        '`cpu_fast_options("train")` with one change; speed is relative to the first row.',
        "",
        "| variant | change | XLA temp buffer, GB | median ms | min ms | speed vs first |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        temp = "" if r["temp_bytes"] is None else f"{r['temp_bytes'] / 1e9:.2f}"
        lines.append(
            f"| {r['variant']} | {r['why']} | {temp} | {r['step_ms_median']:.0f} | "
            f"{r['step_ms_min']:.0f} | {r['speed_vs_first']:.3f} |"
        )
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
