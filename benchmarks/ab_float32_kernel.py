"""A ``mixed_bf16`` step with oneDNN's convs taking the layers' float32 kernels and rounding
them in their own weight reorder (the default: ``Algorithm.rounds_kernel``) against the
same step with each kernel converted to bfloat16 by XLA in front of the call, interleaved.

    python benchmarks/ab_float32_kernel.py --model resnet18 --batch 32 --mode train

Both programs run the shipped conv table (NHWC, SGD with momentum, the step's own compile
options, ``bench.sweep.run_group``); the second is set up with the ``onednn`` algorithm's
value without ``rounds_kernel`` (``interleaved_steps.with_algorithms``). Both give the same
bits. Inference steps run without packed kernels (``JaxRunner.pack_convs``), which would move
the converts out of the timed step. Prints each median and the per-round ratio
``convert / float32_kernel`` (above 1: taking the float32 kernel makes the step faster).
"""

from __future__ import annotations

import argparse

from interleaved_steps import bench_options, run_ab, runner, with_algorithms, workload

from layoutlab.bench.jax_runner import JaxRunner
from layoutlab.nn.conv_algos import get_algorithm

Converted = with_algorithms(onednn=get_algorithm("onednn")._replace(rounds_kernel=False))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18", help="resnet18 (CIFAR stem) or resnet50")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--mode", default="train", choices=("train", "infer"))
    p.add_argument("--precision", default="mixed_bf16")
    p.add_argument("--time-budget", type=float, default=60.0)
    args = p.parse_args(argv)
    w = workload(args.model, args.mode, args.batch)
    opts = bench_options(w, precision=args.precision)
    variants = [(JaxRunner, "float32_kernel"), (Converted, "convert")]
    runners = [runner(w, label, opts, cls=cls, precision=args.precision) for cls, label in variants]
    for r in runners:
        r.pack_convs = False
    what = f"{args.model} {args.mode} b{args.batch} {args.precision}"
    run_ab(runners, what, "float32_kernel", args.time_budget)


if __name__ == "__main__":
    main()
