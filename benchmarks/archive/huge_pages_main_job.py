"""The main job (``layoutlab train``: digits, the README's first command) with and without
transparent huge pages, whole processes timed in ABBA-ordered pairs.

    python benchmarks/archive/huge_pages_main_job.py --pairs 3 --out benchmarks/results/DIR

``huge``: started with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``; ``default``: with
``glibc.malloc.hugetlb=0``, the documented way out (either way the command keeps the
setting it was given; its own rule gives this job none, ``HUGE_PAGES_MIN_PIXELS``). In
``benchmarks/results/huge_pages_zen4_cpu.md`` the ``huge`` side was the command without
``GLIBC_TUNABLES``, which then started itself again with huge pages at any batch. Each process
trains the full default job into a fresh work directory; the wall time includes the
interpreter's start, compiling and the test evaluation. Prints each pair's
times and ``default / huge`` (above 1: huge pages faster); ``--out`` saves
``huge_pages_main_job.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from layoutlab.bench.machine import finish_machine_info, machine_info
from layoutlab.host.huge_pages import TUNABLE

SIDES = {"huge": TUNABLE, "default": "glibc.malloc.hugetlb=0"}


def _run(tunables: str, args: list[str]) -> float:
    env = {**os.environ, "GLIBC_TUNABLES": tunables}
    with tempfile.TemporaryDirectory() as workdir:
        cmd = [sys.executable, "-m", "layoutlab.cli", "train", "--quiet", "--workdir", workdir]
        start = time.perf_counter()
        subprocess.run([*cmd, *args], env=env, check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - start


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--out")
    args, train_args = p.parse_known_args(argv)
    machine = machine_info("cpu")
    pairs = []
    for i in range(args.pairs):
        order = ("huge", "default") if i % 2 == 0 else ("default", "huge")
        pair = {side: _run(SIDES[side], train_args) for side in order}
        pairs.append(pair)
        print(f"pair {i + 1}: huge {pair['huge']:.2f} s, default {pair['default']:.2f} s, "
              f"default/huge {pair['default'] / pair['huge']:.3f}", flush=True)  # fmt: skip
    ratios = [p["default"] / p["huge"] for p in pairs]
    print(f"default/huge median {statistics.median(ratios):.3f} over {len(pairs)} pairs")
    if args.out:
        path = Path(args.out) / "huge_pages_main_job.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        result = {"machine": finish_machine_info(machine), "train_args": train_args,
                  "pairs_s": pairs, "default_over_huge": ratios}  # fmt: skip
        path.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
