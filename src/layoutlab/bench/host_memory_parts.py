"""A ``layoutlab bench`` sweep whose batches straddle the size where the commands' malloc
choice changes (``host.flag.HOST_MEMORY_MIN_PIXELS``), run as one process per
side, so that each batch runs under the host-memory setting layoutlab gives it alone.

The setting is process-wide and one arena for every thread must come before JAX starts, so one
process cannot give batch 1 per-thread arenas and batch 256 one arena, and every single setting
measured slower on one side of a sweep from batch 1 to 256
(docs/performance/measurements.md#host-memory). Each part writes its own results under
``OUT/part-*``; the parent merges their rows, and ``machine.json`` lists the parts with the setting
each ran under. PyTorch's steps share each part's process and setting.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from layoutlab.bench.results import BenchResults, load_results

__all__ = ["host_memory_parts", "run_parts"]


def host_memory_parts(args: argparse.Namespace, argv: list[str] | None) -> list[list[int]] | None:
    """The batch sizes of each process a parsed ``bench`` command line runs in: one per
    host-memory setting among its batches (``host.flag.batch_groups``: per-thread
    arenas, the same with huge pages, one arena with huge pages), where the flags show more
    than one and leave the setting to layoutlab (no ``--keep-host-memory`` or
    ``--no-keep-host-memory``) and ``argv`` is the command line (``cli.main``'s); else
    None (one process)."""
    from layoutlab.host.flag import batch_groups

    # Without the command line (a parser used directly) a part cannot be rerun.
    if getattr(args, "keep_host_memory", None) is not None or argv is None:
        return None
    groups = batch_groups(args)
    if groups is None or len(groups) < 2:
        return None
    return [[b for b, _ in g] for g in groups]


def run_parts(argv: list[str], parts: list[list[int]], out: str | Path) -> BenchResults:
    """``layoutlab bench`` with ``argv`` once per part, in a child process each, its batch
    sizes and output folder (``out/part-1-b1-8``...) appended, which override the same
    flags earlier in ``argv``; returns the merged results. A part whose child fails stops
    the sweep: ``ChildProcessError`` with the child's exit status as ``errno``."""
    runs = []
    for i, batches in enumerate(parts, 1):
        folder = Path(out) / f"part-{i}-b{'-'.join(map(str, batches))}"
        sizes = ",".join(map(str, batches))
        command = [sys.executable, "-m", "layoutlab.cli", *argv, "--batch-sizes", sizes]
        print(f"part {i} of {len(parts)}: batch sizes {sizes}, in its own process", flush=True)
        code = subprocess.run([*command, "--out", str(folder), "--no-plots"]).returncode
        if code not in (0, 1):  # 1: no ok rows, which the merged results show
            raise ChildProcessError(code, f"the bench of batch sizes {sizes} exited with {code}")
        runs.append(load_results(folder))
    machine = dict(runs[0].machine)
    for key in ("host_memory", "huge_pages"):
        machine[key] = "; ".join(
            f"batch {','.join(map(str, b))}: {r.machine.get(key)}"
            for b, r in zip(parts, runs, strict=True)
        )
    machine["host_memory_kept"] = all(r.machine["host_memory_kept"] for r in runs)
    machine["parts"] = [
        {"batch_sizes": b, **{k: r.machine.get(k) for k in ("host_memory", "huge_pages",
                                                           "started_utc", "finished_utc",
                                                           "peaks")}}
        for b, r in zip(parts, runs, strict=True)
    ]  # fmt: skip
    machine["finished_utc"] = runs[-1].machine.get("finished_utc")
    sweep = machine.get("sweep", {})
    machine["sweep"] = {**sweep, "axes": {**sweep.get("axes", {}), "batch_size": sum(parts, [])}}
    notes = list(dict.fromkeys(n for r in runs for n in r.notes))
    return BenchResults(machine, [row for r in runs for row in r.rows], notes)
