"""What XLA does to each model configuration: transposes, converts, conv layouts, cost.

Compiles (without running) every combination of the chosen models, layouts, precisions and
modes with ``layoutlab.xla.inspect_model`` and writes one JSON report per combination,
``results/inspect_<model>_<layout>_<precision>_<mode>_<device>.json``, plus a summary table
on stdout. Compile-only, so it measures what XLA emits, not how fast it runs.

    python benchmarks/inspect_models.py                       # ResNet-18, CIFAR stem, 32x32
    python benchmarks/inspect_models.py --modes infer --precisions fp32 --auto-layout
    python benchmarks/inspect_models.py --models resnet18 small_cnn --model-arg width=8
"""

from __future__ import annotations

import argparse
import importlib.metadata
import itertools
import json
import os
import platform
import time
from pathlib import Path

from layoutlab.arguments import parse_assignments
from layoutlab.bench.machine import cpu_model
from layoutlab.xla import inspect_model
from layoutlab.xla.model_layout_comparison import format_total

RESULTS = Path(__file__).resolve().parent / "results"
COLUMNS = (
    "transposes",
    "kernel_transposes",
    "activation_transposes",
    "memory_permutation_bytes",
    "converts",
    "convert_bytes",
    "fusions",
    "flops",
    "temp_bytes",
    "compile_seconds",
)


def machine() -> dict:
    versions = {}
    for name in ("jax", "jaxlib", "flax", "optax", "numpy"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "os": platform.platform(),
        "versions": versions,
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["resnet18"])
    p.add_argument("--layouts", nargs="+", default=["NHWC", "NCHW"])
    p.add_argument("--precisions", nargs="+", default=["fp32", "mixed_bf16"])
    p.add_argument("--modes", nargs="+", default=["infer", "train"])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--stem", default="cifar", help="ResNet stem ('none' for other models)")
    p.add_argument("--backend", default="cpu")
    p.add_argument("--model-arg", action="append", metavar="NAME=VALUE")
    p.add_argument("--auto-layout", action="store_true")
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    model_kwargs = parse_assignments(args.model_arg, "--model-arg")
    stem = None if args.stem.lower() == "none" else args.stem
    info = machine()
    rows = []
    for model, layout, precision, mode in itertools.product(
        args.models, args.layouts, args.precisions, args.modes
    ):
        t0 = time.perf_counter()
        ins = inspect_model(
            model,
            layout=layout,
            precision=precision,
            mode=mode,
            batch_size=args.batch_size,
            image_size=args.image_size,
            stem=stem if model.startswith("resnet") else None,
            backend=args.backend,
            model_kwargs=model_kwargs,
            auto_layout=args.auto_layout,
        )
        data = ins.to_dict()
        data["machine"] = info
        path = args.out / f"inspect_{ins.file_stem()}.json"
        args.out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")
        totals = ins.totals()
        rows.append((f"{model} {ins.layout} {precision} {mode}", totals, ins.conv_layouts()))
        print(f"{path.name}: {time.perf_counter() - t0:.1f} s", flush=True)

    width = max(len(r[0]) for r in rows)
    print("\n" + "config".ljust(width) + " | " + " | ".join(COLUMNS))
    for label, totals, _ in rows:
        print(
            label.ljust(width) + " | " + " | ".join(format_total(totals[c], ".2f") for c in COLUMNS)
        )
    print()
    for label, _, layouts in rows:
        print(f"{label}: " + ", ".join(f"{k} x{v}" for k, v in layouts.items()))
    print(f"\n{info['cpu_model']}, {info['cpu_count']} CPUs; versions {info['versions']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
