"""Where a CPU training (or inference) step of ResNet-18 CIFAR (or ``--model resnet50``, ImageNet
stem) spends its time, per XLA op.

    python benchmarks/profile_train_step.py --batch 1 --optimizer pytorch [--precision mixed_bf16]

Builds the step ``layoutlab bench`` times with the defaults (the shipped conv table, HWIO
kernels, ``interleaved_steps.bench_options`` for the optimizer), runs it under
``jax.profiler.trace`` and sums the trace's op events per op kind (the HLO name without its
numeric suffix) over every thread (the calling one runs thunks too); XLA:CPU runs
independent ops at the same time, so read the figures as shares of the threads' time, not as
a sum of wall time. Loop fusions run inside their events; a conv's Eigen work can run partly
outside its event, so the conv rows are lower bounds
(``benchmarks/results/profile_train_step_b1_avx512_cpu.md``).
``--show NAME`` prints the optimized HLO line of an op (its shape and operands).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import re
import tempfile
import time

import jax
from interleaved_steps import bench_options, workload

from layoutlab.bench.cases import JaxCase
from layoutlab.bench.jax_runner import JaxRunner


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18", help="resnet18 (CIFAR) or resnet50 (ImageNet)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--mode", default="train", choices=("train", "infer"))
    p.add_argument("--optimizer", default="pytorch", choices=("train", "pytorch"))
    p.add_argument("--precision", default="fp32", help="fp32, mixed_bf16 or another policy")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--show", action="append", default=[], metavar="NAME")
    args = p.parse_args()
    w = workload(args.model, args.mode, args.batch)
    options = bench_options(w, args.optimizer, args.precision)
    case = JaxCase.of(w, args.optimizer, layout="NHWC", precision=args.precision,
                      conv_algorithm="auto", kernel_storage="channels_last",
                      activation_storage="channels_last", xla_options=options,
                      defaults="fast", conv_tune="never")  # fmt: skip
    runner = JaxRunner(case, backend="cpu", steps=50)
    runner.setup()
    for _ in range(5):
        runner.step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        runner.step()
    print(f"step: {1e3 * (time.perf_counter() - t0) / args.steps:.1f} ms")
    out = tempfile.mkdtemp()
    with jax.profiler.trace(out):
        for _ in range(args.steps):
            runner.step()
    trace = glob.glob(f"{out}/**/*.trace.json.gz", recursive=True)[0]
    events = json.load(gzip.open(trace))["traceEvents"]
    us, calls = collections.Counter(), collections.Counter()
    for e in events:
        # Small steps run their thunks on the calling thread too; Python's own spans ("$...")
        # and the runtime's bookkeeping are not ops.
        name = e.get("name", "")
        runtime = name.startswith(("$", "Thunk", "Threadpool", "PjitFunction", "Common", "Pjrt"))
        if e.get("ph") == "X" and not runtime and "Execute" not in name:
            kind = re.sub(r"\.\d+$", "", e["name"])
            if not kind.startswith("end: "):
                us[kind] += e["dur"]
                calls[kind] += 1
    total = sum(us.values())
    print(f"op time on all threads: {total / args.steps / 1e3:.1f} ms per step")
    for kind, t in us.most_common(args.top):
        print(f"{t / args.steps / 1e3:8.2f} ms  {100 * t / total:5.1f}%  "
              f"x{calls[kind] // args.steps:<4d} {kind}")  # fmt: skip
    if args.show:
        text = runner.step_fn.compiled.as_text()
        for name in args.show:
            print(*(ln.strip()[:300] for ln in text.splitlines()
                    if re.search(rf"%{re.escape(name)} = ", ln)), sep="\n")  # fmt: skip


if __name__ == "__main__":
    main()
