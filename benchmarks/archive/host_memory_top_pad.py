"""Per-thread malloc arenas with and without glibc's top pad: does the temp buffer stay mapped?

    python benchmarks/archive/host_memory_top_pad.py --runs 10 --load

Runs the probe of ``tests/helpers/host_memory_probe.py`` (a jitted product through a 36 MB float32
intermediate, 48 calls, minor page faults per call) in fresh processes, alternating three
settings given through ``GLIBC_TUNABLES``: glibc's defaults, per-thread arenas without the top
pad (``mmap_max=0``, no trimming) and with it (``ENV_SETTING_PER_THREAD``). ``--load`` runs two
busy loops and a JAX matmul loop beside the probes, as a parallel test suite does. Prints one
line per probe: how many of calls 17-48 faulted more than half the buffer, and the pattern
(``X`` such a call, ``.`` one that reused the heap).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

# The probe is the test suite's (tests/helpers/host_memory_probe.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "helpers"))
from host_memory_probe import probe  # noqa: E402

_LOAD = """
import jax, jax.numpy as jnp
f = jax.jit(lambda a: jnp.tanh(a @ a))
a = jnp.ones((1500, 1500))
while True:
    a = f(a) * 0.5
    a.block_until_ready()
"""


def _settings() -> dict[str, str | None]:
    from layoutlab.host.memory import ENV_SETTING_PER_THREAD

    with_pad = ENV_SETTING_PER_THREAD.split("=", 1)[1]
    without = ":".join(i for i in with_pad.split(":") if not i.startswith("glibc.malloc.top_pad"))
    return {"glibc defaults": None, "per-thread, no top pad": without, "per-thread": with_pad}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--load", action="store_true", help="busy loops and a JAX loop beside")
    args = p.parse_args(argv)
    load = []
    if args.load:
        busy = [sys.executable, "-c", "while True: pass"]
        load = [subprocess.Popen(busy), subprocess.Popen(busy),
                subprocess.Popen([sys.executable, "-c", _LOAD])]  # fmt: skip
    settings = _settings()
    bad = {name: [] for name in settings}
    try:
        for _ in range(args.runs):
            for name, tunables in settings.items():
                r = probe("default", tunables)
                half = r["temp"] / os.sysconf("SC_PAGE_SIZE") / 2
                marks = "".join("X" if f > half else "." for f in r["faults"])
                bad[name].append(marks[16:].count("X"))
                print(f"{name:24s} {bad[name][-1]:2d}/32 {marks}  load {os.getloadavg()[0]:.1f}")
    finally:
        for proc in load:
            proc.kill()
    for name, counts in bad.items():
        print(f"{name}: steady calls that faulted the buffer, per run: {counts}")


if __name__ == "__main__":
    main()
