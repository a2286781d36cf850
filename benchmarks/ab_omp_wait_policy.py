"""OpenMP's wait policy for oneDNN's threads, A/B on whole steps: one process per variant
and round (libgomp reads its policy once, when it loads), the variants taken in turn round
by round and the rounds paired.

    python benchmarks/ab_omp_wait_policy.py --model resnet50 --batch 16 --precision fp32

Variants (``VARIANTS``, set in the child's environment, which layoutlab keeps): ``passive``
(what layoutlab sets where nothing else did: a thread sleeps as soon as a parallel region
ends), ``active`` (threads spin between regions) and ``spin30k`` (spin 30000 iterations,
then sleep). Each child builds the step as ``layoutlab bench`` does
(``interleaved_steps.runner``: the shipped conv table, SGD with momentum, the bench compile
options), runs two untimed steps and then times steps for ``--seconds``; the persistent
compilation cache is shared, so only the first child compiles. Prints each variant's
median of round medians and ``variant / passive`` per round (above 1: the variant is
slower).
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

# Name -> the environment a child starts with. OMP_WAIT_POLICY set by the environment is
# kept by layoutlab (``onednn_load``); GOMP_SPINCOUNT is how long libgomp's threads spin
# before sleeping (ACTIVE: that long; unset: 300000 iterations with at most one thread per
# core).
VARIANTS = {
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "active": {"OMP_WAIT_POLICY": "ACTIVE"},
    "spin30k": {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "30000"},
}


def child(args) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from interleaved_steps import bench_options, runner, workload

    from layoutlab.nn.conv_algos.onednn_status import onednn_status

    w = workload(args.model, args.mode, args.batch)
    r = runner(w, "x", bench_options(w, precision=args.precision), precision=args.precision)
    r.setup()
    r.step()
    r.step()
    times = []
    end = time.perf_counter() + args.seconds
    while time.perf_counter() < end or len(times) < 3:
        start = time.perf_counter()
        r.step()
        times.append((time.perf_counter() - start) * 1e3)
    print(json.dumps({"ms": times, "policy": onednn_status().wait_policy}))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--mode", default="train", choices=("train", "infer"))
    p.add_argument("--precision", default="fp32")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    names = args.variants.split(",")
    cache = tempfile.mkdtemp(prefix="omp_ab_cache_")
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    base.update(JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    argv_child = [sys.executable, os.path.abspath(__file__), "--child", "--model", args.model,
                  "--batch", str(args.batch), "--mode", args.mode, "--precision",
                  args.precision, "--seconds", str(args.seconds)]  # fmt: skip
    rounds: dict[str, list[float]] = {n: [] for n in names}
    for i in range(args.rounds):
        order = names if i % 2 == 0 else names[::-1]
        for name in order:
            env = {**base, **VARIANTS[name]}
            out = subprocess.run(argv_child, env=env, capture_output=True, text=True, check=True)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            rounds[name].append(statistics.median(got["ms"]))
            print(f"round {i} {name}: {rounds[name][-1]:.1f} ms ({len(got['ms'])} steps; "
                  f"{got['policy']})", flush=True)  # fmt: skip
    from layoutlab.bench.stats import paired_ratio
    from layoutlab.fast_defaults import cpu_kind

    for name in names:
        ratio = paired_ratio(rounds[name], rounds["passive"]) if "passive" in rounds else None
        print(cpu_kind(), args.model, args.batch, args.mode, args.precision, name,
              f"{statistics.median(rounds[name]):.1f} ms", "vs passive:", ratio)  # fmt: skip


if __name__ == "__main__":
    main()
