"""Whole `layoutlab evaluate` processes under glibc's malloc defaults, with host memory kept
in one arena, and kept with transparent huge pages, in rotated triples.

    python benchmarks/archive/evaluate_host_memory.py --test-images 10000 --triples 2 \
        --out benchmarks/results/DIR

`evaluate` keeps glibc's defaults (it is not among ``KEEP_HOST_MEMORY_COMMANDS``); its eval
step runs batches of up to 500 images, whose temp buffer glibc maps fresh on every call.
glibc reads its tunables only when a process starts, so each setting is a process of its
own, started with ``GLIBC_TUNABLES`` (``host.memory.ENV_SETTING`` for one arena, plus
``host.huge_pages.TUNABLE``). The script first trains a ResNet-18 CIFAR run for one step on
synthetic 32x32x3 images, then evaluates it ``--triples`` times per setting, the order
rotating triple by triple so that a drift of the machine falls on every setting. Each
process's wall time (interpreter start, restore, compile and evaluation), user and system
CPU time and minor page faults are recorded; ``--out`` saves ``evaluate_host_memory.json``.
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
from layoutlab.host.memory import ENV_SETTING

# ENV_SETTING is the whole `GLIBC_TUNABLES=...` assignment the docs show.
_ONE_ARENA = ENV_SETTING.split("=", 1)[1]
# Each setting's GLIBC_TUNABLES (None: unset).
SIDES = {
    "glibc default": None,
    "one arena": _ONE_ARENA,
    "one arena, huge pages": f"{_ONE_ARENA}:{TUNABLE}",
}


def _evaluate(workdir: Path, tunables: str | None) -> dict:
    env = dict(os.environ)
    env.pop("GLIBC_TUNABLES", None)
    if tunables is not None:
        env["GLIBC_TUNABLES"] = tunables
    cmd = [sys.executable, "-m", "layoutlab.cli", "evaluate", "--workdir", str(workdir), "--json"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"evaluate failed under GLIBC_TUNABLES={tunables!r}")
    result = json.loads(out)
    return {"wall_s": wall, "user_s": usage.ru_utime, "sys_s": usage.ru_stime,
            "minflt": usage.ru_minflt, "test_loss": result["test_loss"]}  # fmt: skip


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--test-images", type=int, default=10_000)
    p.add_argument("--triples", type=int, default=2)
    p.add_argument("--out")
    args = p.parse_args(argv)
    machine = machine_info("cpu")
    workdir = Path(tempfile.mkdtemp(prefix="evaluate_host_memory-"))
    data = f"synthetic:32x32x3:10:{5 * args.test_images}"  # a fifth is the test split
    subprocess.run([sys.executable, "-m", "layoutlab.cli", "train", "--model", "resnet18",
                    "--stem", "cifar", "--data", data, "--steps", "1", "--quiet",
                    "--workdir", str(workdir)], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    names = list(SIDES)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for i in range(args.triples):
        order = names[i % 3 :] + names[: i % 3]
        for name in order:
            runs[name].append(_evaluate(workdir, SIDES[name]))
            r = runs[name][-1]
            print(f"triple {i + 1} {name}: {r['wall_s']:.1f} s wall, {r['user_s']:.1f} s user, "
                  f"{r['sys_s']:.1f} s sys, {r['minflt']} minor faults", flush=True)  # fmt: skip
    for name, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "user_s", "sys_s")}
        print(f"{name}: median wall {med['wall_s']:.1f} s, user {med['user_s']:.1f} s, "
              f"sys {med['sys_s']:.1f} s")  # fmt: skip
    if args.out:
        path = Path(args.out) / "evaluate_host_memory.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        result = {"machine": finish_machine_info(machine), "test_images": args.test_images,
                  "glibc_tunables": SIDES, "runs": runs}  # fmt: skip
        path.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
