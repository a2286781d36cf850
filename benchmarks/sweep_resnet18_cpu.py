"""Reproduce benchmarks/results/resnet18_cpu.md on this machine: ResNet-18 with the CIFAR stem
at 32x32 and with the ImageNet stem at 224x224, NHWC/NCHW x fp32/mixed_bf16, inference and
training, beside PyTorch eager (contiguous and channels_last, fp32 and autocast bf16).

    python benchmarks/sweep_resnet18_cpu.py [--only cifar|imagenet] [--repeats 5]
        [--max-step-seconds 45]
        [--note "machine shared with other jobs"] [--out benchmarks/results]

Writes ``<out>/resnet18_<stem>_cpu/`` (results.csv, results.json, machine.json, PNG plots)
and ``<out>/resnet18_cpu.md`` (the Markdown table). Each part is the same as

    layoutlab bench --model resnet18 --stem cifar --image-size 32 --batch-sizes 32,128 \\
        --layouts NHWC,NCHW --precisions fp32,mixed_bf16 --modes infer,train \\
        --torch --repeats 5 --warmup 1 --max-step-seconds 45 --backend cpu --out DIR
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from layoutlab.bench import (
    SweepConfig,
    load_results,
    markdown_table,
    plot_all,
    run_sweep,
    save_results,
)
from layoutlab.train.spec import config_for

PARTS = {
    "cifar": {"stem": "cifar", "image_size": 32, "batch_sizes": (32, 128)},
    "imagenet": {"stem": "imagenet", "image_size": 224, "batch_sizes": (8, 16)},
}


def run_part(name: str, out_root: Path, args: argparse.Namespace) -> Path:
    part = PARTS[name]
    config = SweepConfig(
        config_for("pytorch", model="resnet18", model_kwargs={"stem": part["stem"]}),
        axes={
            "layout": ("NHWC", "NCHW"),
            "precision": ("fp32", "mixed_bf16"),
            "batch_size": part["batch_sizes"],
        },
        modes=("infer", "train"),
        image_size=part["image_size"],
        repeats=args.repeats,
        warmup=args.warmup,
        backend="cpu",
        torch=True,
        max_step_s=args.max_step_seconds,
        note=args.note,
    )
    log = lambda msg: print(msg, file=sys.stderr, flush=True)
    log(f"== resnet18 {name} stem, {part['image_size']}px, batches {part['batch_sizes']}")
    t0 = time.perf_counter()
    results = run_sweep(config, log=log)
    results.machine["wall_s"] = round(time.perf_counter() - t0, 1)
    out = save_results(out_root / f"resnet18_{name}_cpu", results)
    plot_all(results.rows, out)
    return out


def table(out_root: Path, names) -> str:
    parts = []
    for name in names:
        directory = out_root / f"resnet18_{name}_cpu"
        if not (directory / "results.json").is_file():
            continue
        res = load_results(directory)
        m = res.machine
        shared = f"; {m['note']}" if m.get("note") else ""
        parts.append(
            f"### ResNet-18, {name} stem, input {res.rows[0]['input_shape']}\n\n"
            f"{m['cpu_model']}, {m['usable_cores']} cores, jax {m['versions']['jax']}, "
            f"torch {m['versions']['torch']} ({m['torch_threads']} threads), load average "
            f"{m['load_average']} at start{shared}.\n\n" + markdown_table(res.rows)
        )
        parts.extend(f"\nnote: {n}" for n in res.notes)
    return "\n\n".join(parts) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=tuple(PARTS), help="run one part (default: both)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument(
        "--max-step-seconds",
        type=float,
        default=45.0,
        help="skip configurations slower than this per step (autocast bf16 on CPUs without "
        "bf16 hardware can take minutes per step)",
    )
    p.add_argument("--note", help="e.g. 'shared machine: other jobs were running'")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    p.add_argument("--table-only", action="store_true", help="rebuild the table from results")
    args = p.parse_args(argv)
    names = [args.only] if args.only else list(PARTS)
    if not args.table_only:
        for name in names:
            run_part(name, args.out, args)
    text = table(args.out, list(PARTS))
    (args.out / "resnet18_cpu.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
