"""layoutlab's best CPU configuration beside PyTorch eager: the table of the "beat PyTorch on
CPU" work. ResNet-18 with the CIFAR stem (32x32, batch 128) and the ImageNet stem (224x224,
batch 16), inference and training step, fp32 and bf16, each part one interleaved sweep.

    python benchmarks/best_vs_torch_cpu.py [--parts cifar_fp32,imagenet_fp32,cifar_bf16,
        imagenet_bf16] [--summarize-only] [--out benchmarks/results]

layoutlab's side: NHWC (and NCHW for the fp32 parts), per-shape autotuned conv algorithms
(``auto``), HWIO kernel storage and ``layoutlab.xla.cpu_fast_options(mode)``. Each part is

    layoutlab bench --model resnet18 --stem cifar --image-size 32 --batch-sizes 128 \\
        --layouts NHWC,NCHW --precisions fp32 --modes infer,train --conv-algos auto \\
        --conv-tune-repeats 2 --kernel-storage channels_last --cpu-fast --torch \\
        --repeats 5 --warmup 1 --keep-host-memory --out DIR

(bf16 parts: ``--precisions mixed_bf16 --repeats 3 --max-step-seconds 100``: PyTorch's
autocast bf16 takes minutes per step on CPUs without bf16 instructions). Writes
``<out>/resnet18_<part>_best_cpu/`` per part and ``<out>/resnet18_best_vs_torch_cpu.md``.

``--keep-host-memory`` (``layoutlab.host.keep_host_memory()``) is process-wide, so PyTorch's
rows in the same run get it too; ``--default-malloc`` leaves glibc's malloc as it is.

The ``*_compile`` parts are the same fp32 sweeps with ``--torch-compile`` added, so
``torch.compile`` (inductor) runs beside eager PyTorch and layoutlab in the same rounds; they
write ``<out>/resnet18_<stem>_b<batch>_vs_compile_cpu/`` and a second table. They are not in
the default ``--parts`` (inductor's C++ compile adds minutes per configuration).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from layoutlab.bench import SweepConfig, load_results, plot_all, run_sweep, save_results
from layoutlab.host import keep_host_memory
from layoutlab.train.spec import config_for

PARTS = {
    "cifar_fp32": ("cifar", 32, 128, ("NHWC", "NCHW"), "fp32"),
    "imagenet_fp32": ("imagenet", 224, 16, ("NHWC", "NCHW"), "fp32"),
    "cifar_bf16": ("cifar", 32, 128, ("NHWC",), "mixed_bf16"),
    "imagenet_bf16": ("imagenet", 224, 16, ("NHWC",), "mixed_bf16"),
}
COMPILE_PARTS = {
    "cifar_fp32_compile": PARTS["cifar_fp32"],
    "imagenet_fp32_compile": PARTS["imagenet_fp32"],
}


def part_dir(out: Path, name: str) -> Path:
    if name in COMPILE_PARTS:
        stem, _, batch, _, _ = COMPILE_PARTS[name]
        return out / f"resnet18_{stem}_b{batch}_vs_compile_cpu"
    stem, _, batch, _, precision = PARTS[name]
    suffix = "" if precision == "fp32" else "_bf16"
    return out / f"resnet18_{stem}_b{batch}{suffix}_best_cpu"


def run_part(name: str, out: Path, note: str | None) -> None:
    stem, size, batch, layouts, precision = {**PARTS, **COMPILE_PARTS}[name]
    half = precision != "fp32"
    run = config_for(
        "pytorch",
        model="resnet18",
        model_kwargs={"stem": stem},
        batch_size=batch,
        precision=precision,
        conv_algorithm="auto",
        kernel_storage="channels_last",
        cpu_fast=True,
    )
    config = SweepConfig(
        run,
        axes={"layout": layouts},
        modes=("infer", "train"),
        image_size=size,
        conv_tune_repeats=2,
        torch=True,
        torch_compile=name in COMPILE_PARTS,
        repeats=3 if half else 5,
        warmup=1,
        max_step_s=100 if half else None,
        note=note,
    )
    results = run_sweep(config, log=lambda m: print(m, file=sys.stderr, flush=True))
    directory = save_results(part_dir(out, name), results)
    plot_all(results.rows, directory)


def _cell(row: dict | None) -> str:
    if row is None:
        return "–"
    if row["status"] != "ok":
        return row["status"]
    return f"{row['images_per_sec']:.1f}"


def _host_memory(m: dict) -> str:
    # Runs from before keep_host_memory existed recorded nothing: they ran glibc's default.
    return "kept (both frameworks)" if m.get("host_memory_kept") else "glibc default"


def _machine_line(directory: Path, m: dict) -> str:
    v = m.get("versions", {})
    return (
        f"- `{directory.name}`: {m.get('cpu_model')}, {m.get('usable_cores')} cores, "
        f"jax {v.get('jax')}, torch {v.get('torch')} ({m.get('torch_threads')} threads), "
        f"load average {m.get('load_average')} at start, {m.get('load_average_end')} at "
        f"end, {m.get('started_utc')}; host memory {_host_memory(m)}; {m.get('note') or ''}"
    )


def _saved_parts(out: Path, names):
    """``(name, directory, results)`` for each of ``names`` whose results are on disk."""
    for name in names:
        directory = part_dir(out, name)
        if (directory / "results.json").is_file():
            yield name, directory, load_results(directory)


def _best(rows: list[dict], framework: str) -> dict | None:
    ok = [r for r in rows if r["framework"] == framework and r["status"] == "ok"]
    return max(ok, key=lambda r: r["images_per_sec"], default=None)


def _labelled(row: dict | None, key: str) -> str:
    return _cell(row) + (f" ({row[key]})" if row else "")


def _ratio(a: dict | None, b: dict | None) -> str:
    if a is None or b is None:
        return ""
    return f"**{a['images_per_sec'] / b['images_per_sec']:.2f}**"


def summarize_compile(out: Path) -> list[str]:
    """The second table: layoutlab's best beside torch.compile, timed in the same rounds."""
    lines = [
        "",
        "## Beside torch.compile",
        "",
        "The same fp32 sweeps with `--torch-compile`: layoutlab, eager PyTorch and "
        "`torch.compile` (inductor, default mode) timed in the same rounds. Compile time is "
        "not in the throughput (each side's first call is excluded).",
        "",
        "| model | mode | batch | layoutlab best | eager best | torch.compile best "
        "| vs eager | vs torch.compile |",
        "|---|---|---|---|---|---|---|---|",
    ]
    machines = []
    for name, directory, res in _saved_parts(out, COMPILE_PARTS):
        stem, size, batch, _, _ = COMPILE_PARTS[name]
        machines.append(_machine_line(directory, res.machine))
        for mode in ("infer", "train"):
            rows = [r for r in res.rows if r["mode"] == mode]
            ours = _best(rows, "layoutlab")
            eager = _best(rows, "torch")
            compiled = _best(rows, "torch.compile")
            lines.append(
                f"| {stem} {size}x{size} | {mode} | {batch} | {_labelled(ours, 'layout')} | "
                f"{_labelled(eager, 'memory_format')} | {_labelled(compiled, 'memory_format')} "
                f"| {_ratio(ours, eager)} | {_ratio(ours, compiled)} |"
            )
    if not machines:
        return []
    return lines + ["", "Machines:", *machines]


def summarize(out: Path) -> str:
    lines = [
        "# ResNet-18 on CPU: layoutlab's best configuration beside PyTorch eager",
        "",
        "Each part is one `layoutlab bench` run, layoutlab and PyTorch timed round by round "
        "(A B A B), so a ratio compares the same minutes of the same machine. layoutlab: "
        "autotuned conv algorithms (`auto`), HWIO kernels, `--cpu-fast`. Throughput "
        "in images/s; ratio = layoutlab's best / PyTorch eager's best (either memory format) "
        "in the same precision class.",
        "",
        "| model | precision | mode | batch | layoutlab best | PyTorch best | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    machines = []
    for name, directory, res in _saved_parts(out, PARTS):
        machines.append(_machine_line(directory, res.machine))
        for mode in ("infer", "train"):
            rows = [r for r in res.rows if r["mode"] == mode]
            best = _best(rows, "layoutlab")
            tbest = _best(rows, "torch")
            ours_txt = _cell(best) + (f" ({best['layout']})" if best else "")
            torch_txt = (
                f"{_cell(tbest)} ({tbest['memory_format']}, {tbest['precision']})"
                if tbest
                else "skipped (> 100 s/step)"
            )
            ratio = best.get("ratio_vs_torch_best") if best else None
            stem, size, batch, _, precision = PARTS[name]
            lines.append(
                f"| {stem} {size}x{size} | {precision} | {mode} | {batch} | {ours_txt} | "
                f"{torch_txt} | {'' if ratio is None else f'**{ratio:.2f}**'} |"
            )
    return "\n".join(lines + ["", "Machines:", *machines, *summarize_compile(out), ""])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default=",".join(PARTS))
    p.add_argument("--summarize-only", action="store_true")
    p.add_argument("--note", default="shared 2-core VM; layoutlab and PyTorch interleaved")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument(
        "--default-malloc",
        action="store_true",
        help="leave glibc's malloc as it is (default: layoutlab.host.keep_host_memory(), for "
        "both frameworks: the process is shared)",
    )
    args = p.parse_args(argv)
    out = Path(args.out)
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    known = {**PARTS, **COMPILE_PARTS}
    unknown = sorted(set(parts) - set(known))
    if unknown:
        p.error(f"unknown parts {unknown}; choose from {', '.join(known)}")
    if not args.summarize_only:
        if not args.default_malloc:
            keep_host_memory()  # before any part starts JAX; PyTorch's side gets it too
        for name in parts:
            run_part(name, out, args.note)
    text = summarize(out)
    (out / "resnet18_best_vs_torch_cpu.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
