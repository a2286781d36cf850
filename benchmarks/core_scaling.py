"""The defaults and PyTorch on one core and on every core: how each scales with the cores.

    python benchmarks/core_scaling.py --out benchmarks/results/core_scaling_avx512_cpu \
        [--model resnet18 --stem cifar --image-size 32 --batch-sizes 1,8,32 --modes infer,train]
        [--cores 1,2] [--repeats 2] [--time-budget 15]

Runs the plain ``layoutlab bench ... --torch`` (NHWC, fp32, the defaults beside PyTorch
eager in both memory formats, interleaved round by round) once per core count, each in a
process confined to that many CPUs (``os.sched_setaffinity``: XLA:CPU sizes its thread
pool and PyTorch its OpenMP threads from the CPUs a process may use). The core counts
alternate (1, 2, 1, 2, ...) for ``--repeats`` rounds, so a drift in the shared machine's
speed lands on both. Per mode and batch it reports:

- on each core count, the defaults' ratio to PyTorch's faster memory format (bench's
  per-round paired ratio with its 95% interval, above 1 layoutlab is faster), per repeat;
- each framework's speed-up from the fewest to the most cores: step ms on the fewest over
  step ms on the most, from the two adjacent runs of one repeat (different processes, so
  not interleaved: read the repeats' spread as its uncertainty).

Each run's own folder (``results.json``, ``machine.json``) is kept under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from layoutlab.bench.report import markdown_grid, ratio_text

# `layoutlab ...` through the running interpreter (no reliance on the script being on PATH).
_CLI = "import sys; from layoutlab.cli import main; sys.exit(main())"


def _bench(args, cores: list[int], out: Path) -> dict:
    command = [
        sys.executable, "-c", _CLI, "bench", "--model", args.model, "--stem", args.stem,
        "--image-size", str(args.image_size), "--layouts", "NHWC",
        "--precisions", "fp32", "--batch-sizes", args.batch_sizes, "--modes", args.modes,
        "--torch", "--time-budget", str(args.time_budget), "--no-roofline", "--no-plots",
        "--out", str(out),
    ]  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "bench.log", "w") as log:
        subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT,
                       preexec_fn=lambda: os.sched_setaffinity(0, cores))  # fmt: skip
    return json.loads((out / "results.json").read_text())


def _cells(result: dict) -> dict:
    """``{(mode, batch): (defaults row, fastest PyTorch row)}`` of one bench run."""
    cells = {}
    ok = [r for r in result["rows"] if r["status"] == "ok"]
    for r in ok:
        # A plain bench's layoutlab row is its defaults ("fast"), the only one without flags.
        if r["framework"] != "layoutlab" or r.get("defaults") != "fast":
            continue
        key = (r["mode"], r["batch_size"])
        torch = [t for t in ok if t["framework"] == "torch"
                 and (t["mode"], t["batch_size"]) == key]  # fmt: skip
        cells[key] = (r, min(torch, key=lambda t: t["step_ms_median"]) if torch else None)
    return cells


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--stem", default="cifar")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch-sizes", default="1,8,32")
    p.add_argument("--modes", default="infer,train")
    p.add_argument("--cores", default=None, help="core counts, e.g. 1,2 (default: 1 and all)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--time-budget", type=float, default=15.0)
    p.add_argument("--out", required=True, help="folder for the runs; also writes OUT.md/.json")
    args = p.parse_args(argv)
    usable = sorted(os.sched_getaffinity(0))
    try:
        counts = [int(c) for c in args.cores.split(",")] if args.cores else [1, len(usable)]
    except ValueError:
        counts = []
    if len(counts) < 2 or min(counts) < 1 or max(counts) > len(usable):
        p.error(f"--cores needs two or more counts from 1 to {len(usable)} (the usable CPUs).")
    out = Path(args.out)
    runs = []
    for rep in range(args.repeats):
        for n in counts:
            folder = out / f"rep{rep}_cores{n}"
            print(f"repeat {rep}, {n} core(s) -> {folder}", flush=True)
            runs.append({"repeat": rep, "cores": n, "folder": folder.name,
                         "cells": _cells(_bench(args, usable[:n], folder))})  # fmt: skip
    keys = sorted({k for run in runs for k in run["cells"]})
    lo, hi = min(counts), max(counts)
    ratio_rows, scaling_rows, records = [], [], []
    for mode, batch in keys:
        for n in counts:
            cells = [run["cells"].get((mode, batch)) for run in runs if run["cores"] == n]
            ratio_rows.append((mode, batch, n, "; ".join(
                f"{d['step_ms_median']:.1f} vs {t['step_ms_median']:.1f}: {ratio_text(d) or '-'}"
                for d, t in (c for c in cells if c and c[1])) or "-"))  # fmt: skip
        for rep in range(args.repeats):
            pair = {r["cores"]: r["cells"].get((mode, batch)) for r in runs if r["repeat"] == rep}
            if not (pair.get(lo) and pair.get(hi) and pair[lo][1] and pair[hi][1]):
                continue
            ours = pair[lo][0]["step_ms_median"] / pair[hi][0]["step_ms_median"]
            theirs = pair[lo][1]["step_ms_median"] / pair[hi][1]["step_ms_median"]
            scaling_rows.append((mode, batch, rep, f"{ours:.2f}", f"{theirs:.2f}"))
            records.append({"mode": mode, "batch": batch, "repeat": rep, "layoutlab_speedup":
                            ours, "torch_speedup": theirs})  # fmt: skip
    summary = {
        "counts": counts,
        "runs": [{"repeat": r["repeat"], "cores": r["cores"], "folder": r["folder"],
                  "cells": [{"mode": m, "batch": b, "layoutlab_ms": d["step_ms_median"],
                             "torch_ms": t and t["step_ms_median"],
                             "ratio": d.get("ratio_vs_torch_best"),
                             "ratio_ci": [d.get("ratio_ci_low"), d.get("ratio_ci_high")]}
                            for (m, b), (d, t) in sorted(r["cells"].items())]}
                 for r in runs],
        "speedups": records,
    }  # fmt: skip
    lines = [
        f"# {args.model} {args.stem} {args.image_size}px, NHWC fp32: the defaults and PyTorch "
        f"on {', '.join(map(str, counts))} cores",
        "",
        "Defaults vs PyTorch's faster memory format, per repeat (step ms of each, then the "
        "per-round ratio [95%], above 1 layoutlab is faster):",
        "",
        *markdown_grid(
            ("mode", "batch", "cores", "layoutlab ms vs PyTorch ms: ratio"), ratio_rows
        ),  # fmt: skip
        "",
        f"Speed-up from {lo} to {hi} cores (step ms on {lo} / on {hi}), per repeat:",
        "",
        *markdown_grid(("mode", "batch", "repeat", "layoutlab", "PyTorch"), scaling_rows),
    ]
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
