"""Host memory kept or left to glibc's defaults, beside PyTorch: what each malloc setting does
to both sides of a bench comparison.

    python benchmarks/archive/host_memory_switch.py --cases resnet18:train:1,resnet18:train:128 \
        --out benchmarks/results/every_batch_zen4_cpu/host_memory_switch

A bench sweep keeps one malloc setting for the whole process, and it is process-wide: PyTorch's
steps run under it too. This times, per case, layoutlab's defaults (NHWC fp32) beside PyTorch
eager (channels_last), interleaved as ``bench`` runs them, in one process under each setting
in turn: per-thread arenas kept (``keep_host_memory("per_thread")``), then released to
glibc's default limits (``release_host_memory()``), then both again. ``--fresh`` first times
the pair in fresh processes with glibc's true defaults (its dynamic mmap threshold, which no
setting brings back), per-thread arenas and one arena, each given through the environment.
Prints each median and the ratio PyTorch / layoutlab per setting; writes ``results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from interleaved_steps import bench_options, runner, save_results, workload

from layoutlab.bench.cases import TorchCase
from layoutlab.bench.machine import machine_info
from layoutlab.bench.sweep import run_group
from layoutlab.bench.torch_runner import TorchRunner
from layoutlab.host.memory import (
    ENV_SETTING,
    ENV_SETTING_PER_THREAD,
    keep_host_memory,
    release_host_memory,
)

KEEP = ("framework", "step_ms_median", "step_ms_ci_low", "step_ms_ci_high", "dispersion",
        "other_cores", "steps_per_round", "status", "unstable_reason")  # fmt: skip
SET = {"kept": lambda: keep_host_memory("per_thread"), "released": release_host_memory}
# Fresh processes: glibc's true defaults (its dynamic mmap threshold, which no setting brings
# back), and the two settings the commands give a process from its start.
FRESH = {
    "fresh: glibc defaults": None,
    "fresh: per-thread arenas kept": ENV_SETTING_PER_THREAD,
    "fresh: one arena": ENV_SETTING,
}


def _pair(case: str):
    model, mode, batch = case.rsplit(":", 2)
    w = workload(model, mode, int(batch))
    theirs = TorchRunner(TorchCase(w, "channels_last", "fp32"))
    return runner(w, "defaults", bench_options(w)), theirs


def _rows(case: str, rows: list[dict], setting: str) -> list[dict]:
    return [{"case": case, "host_memory": setting, **{k: r.get(k) for k in KEEP}} for r in rows]


def _group(case: str, budget: float) -> list[dict]:
    return run_group(list(_pair(case)), repeats="auto", warmup=3, budget_s=budget, blocks=True)


def phases(case: str, budget: float) -> list[dict]:
    """The pair timed with host memory kept, then released, then both again, in this
    process: what a sweep that switches per batch group runs."""
    rows = []
    for n in (1, 2):
        for setting, apply in SET.items():
            apply()
            rows += _rows(case, _group(case, budget), f"{setting} ({n})")
    return rows


def fresh(case: str, budget: float, setting: str) -> list[dict]:
    """The pair in a new process with ``FRESH[setting]`` given through the environment."""
    code = (
        "import json, sys; sys.path[:0] = ['benchmarks', 'benchmarks/archive']\n"
        "import host_memory_switch as h\n"
        f"print('ROWS', json.dumps(h._rows({case!r}, h._group({case!r}, {budget}), "
        f"{setting!r})))"
    )
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if FRESH[setting]:
        env["GLIBC_TUNABLES"] = FRESH[setting].split("=", 1)[1]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    line = next(x for x in out.stdout.splitlines() if x.startswith("ROWS "))
    return json.loads(line[5:])


def markdown(rows: list[dict]) -> str:
    lines = ["| case | host memory | layoutlab ms | PyTorch eager ms | PyTorch / layoutlab |",
             "|---|---|---|---|---|"]  # fmt: skip
    groups: dict = {}
    for r in rows:
        if r["status"] == "ok":
            groups.setdefault((r["case"], r["host_memory"]), {})[r["framework"]] = r
    for (case, setting), got in groups.items():
        if {"layoutlab", "torch"} <= set(got):
            a, b = (got[k]["step_ms_median"] for k in ("layoutlab", "torch"))
            lines.append(f"| {case} | {setting} | {a:.1f} | {b:.1f} | {b / a:.2f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="resnet18:train:1,resnet18:train:128")
    p.add_argument("--time-budget", type=float, default=20.0, help="seconds per group")
    p.add_argument("--fresh", action="store_true", help="also time fresh processes (FRESH)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    machine = machine_info("cpu", note="host_memory_switch")
    rows = []
    for case in args.cases.split(","):
        if args.fresh:
            rows += [r for s in FRESH for r in fresh(case, args.time_budget, s)]
        rows += phases(case, args.time_budget)
        print(markdown([r for r in rows if r["case"] == case]), flush=True)
    save_results(args.out, machine, rows)
    print(markdown(rows))


if __name__ == "__main__":
    main()
