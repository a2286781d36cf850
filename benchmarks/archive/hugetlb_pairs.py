"""glibc's transparent huge pages (``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``) against its
default, whole steps, in process pairs.

    python benchmarks/archive/hugetlb_pairs.py --cells resnet18:train:8,resnet18:infer:32 \
        --pairs 4 --out benchmarks/results/DIR

glibc reads the tunable only when a process starts, so one process cannot time both sides.
Each cell runs ``--pairs`` pairs of ``step_variants.py`` processes (``--variants
table,torch``: layoutlab's defaults and PyTorch eager, interleaved in the process), one with
the tunable and one without, the order alternating pair by pair (ABBA) so that a drift in the
machine's speed over the pair falls on both sides. Host memory is kept as ``layoutlab bench``
keeps it at that batch (``--keep-host-memory``). Prints, per cell, each side's step medians
and the per-pair ratio ``default / huge`` of layoutlab's and PyTorch's medians (above 1: huge
pages faster), and ``--out`` saves ``hugetlb_pairs.json`` with every process's rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from interleaved_steps import workload

from layoutlab.bench.machine import finish_machine_info, machine_info
from layoutlab.host.flag import HOST_MEMORY_MIN_PIXELS
from layoutlab.host.huge_pages import TUNABLE

HERE = Path(__file__).resolve().parents[1]  # benchmarks/, where step_variants.py is


def _arenas(model: str, mode: str, batch: int) -> str:
    w = workload(model, mode, batch)
    pixels = batch * w.spatial[0] * w.spatial[1]
    return "one" if pixels >= HOST_MEMORY_MIN_PIXELS else "per_thread"


def _one_process(model: str, mode: str, batch: int, huge: bool, budget: float) -> dict:
    env = dict(os.environ)
    env.pop("GLIBC_TUNABLES", None)
    if huge:
        env["GLIBC_TUNABLES"] = TUNABLE
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, str(HERE / "step_variants.py"), "--model", model, "--mode", mode,
               "--batch", str(batch), "--variants", "table,torch", "--time-budget", str(budget),
               "--keep-host-memory", _arenas(model, mode, batch), "--out", out]  # fmt: skip
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
        path = Path(out) / f"step_variants_{model}_{mode}_b{batch}.json"
        return json.loads(path.read_text())


def _medians(result: dict) -> tuple[float, float]:
    ours, torch = result["rows"]
    return ours["step_ms_median"], torch["step_ms_median"]


def run_cell(model: str, mode: str, batch: int, pairs: int, budget: float) -> dict:
    """``pairs`` ABBA-ordered process pairs of one cell, with the per-pair ratios."""
    processes = []
    for i in range(pairs):
        order = (True, False) if i % 2 == 0 else (False, True)
        for huge in order:
            result = _one_process(model, mode, batch, huge, budget)
            processes.append({"pair": i, "huge": huge, "result": result})
    ratios = {"layoutlab": [], "torch": []}
    for i in range(pairs):
        huge, default = (
            _medians(next(p["result"] for p in processes if p["pair"] == i and p["huge"] is h))
            for h in (True, False)
        )
        ratios["layoutlab"].append(default[0] / huge[0])
        ratios["torch"].append(default[1] / huge[1])
    summary = {
        side: {"median": statistics.median(r), "min": min(r), "max": max(r), "pairs": r}
        for side, r in ratios.items()
    }
    ms = {
        ("huge" if h else "default"): {
            "layoutlab": [_medians(p["result"])[0] for p in processes if p["huge"] is h],
            "torch": [_medians(p["result"])[1] for p in processes if p["huge"] is h],
        }
        for h in (True, False)
    }
    return {"model": model, "mode": mode, "batch": batch, "keep_host_memory":
            _arenas(model, mode, batch), "default_over_huge": summary, "step_ms": ms,
            "processes": processes}  # fmt: skip


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", required=True, help="MODEL:MODE:BATCH,... (step_variants' names)")
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--time-budget", type=float, default=20.0, help="per process, seconds")
    p.add_argument("--out")
    args = p.parse_args(argv)
    machine = machine_info("cpu")
    cells = []
    for spec in args.cells.split(","):
        model, mode, batch = spec.split(":")
        cell = run_cell(model, mode, int(batch), args.pairs, args.time_budget)
        cells.append(cell)
        ms = cell["step_ms"]
        print(f"{model} {mode} b{batch}: layoutlab huge {_span(ms['huge']['layoutlab'])} ms, "
              f"default {_span(ms['default']['layoutlab'])} ms; torch huge "
              f"{_span(ms['huge']['torch'])}, default {_span(ms['default']['torch'])}; "
              + "; ".join(f"{side} default/huge {_ratios(s)}"
                          for side, s in cell["default_over_huge"].items()),
              flush=True)  # fmt: skip
        if args.out:
            path = Path(args.out) / "hugetlb_pairs.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            result = {"machine": finish_machine_info(dict(machine)), "tunable": TUNABLE,
                      "cells": cells}  # fmt: skip
            path.write_text(json.dumps(result, indent=1, default=str) + "\n")


def _span(values: list[float]) -> str:
    return f"{min(values):.1f}-{max(values):.1f}"


def _ratios(s: dict) -> str:
    return f"{s['median']:.3f} ({', '.join(f'{r:.3f}' for r in s['pairs'])})"


if __name__ == "__main__":
    main()
