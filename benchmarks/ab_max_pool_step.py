"""A whole step (training, or with ``--mode infer`` the eval forward) with its max pools on
oneDNN's primitive (the default where the extension has it) against the same step with
XLA's max pool, interleaved.

    python benchmarks/ab_max_pool_step.py --model resnet50 --batch 16 --precision mixed_bf16

The second program is set up with every ``MaxPool`` on XLA's ops and its BatchNorms as the
first's (``interleaved_steps.with_layer_impls``: ``--layer-impl xla`` would move both);
both run the shipped conv table (``bench.sweep.run_group``, NHWC, SGD with momentum, the
step's own compile options). Prints each median and the per-round ratio ``xla / onednn``
(above 1: oneDNN's max pool makes the step faster).
"""

from __future__ import annotations

import argparse

from interleaved_steps import bench_options, run_ab, runner, with_layer_impls, workload

from layoutlab.bench.jax_runner import JaxRunner

XlaMaxPool = with_layer_impls(max_pool="xla")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet50", help="resnet50 (ImageNet stem, 224x224)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--mode", default="train", choices=("train", "infer"))
    p.add_argument("--precision", default="mixed_bf16")
    p.add_argument("--time-budget", type=float, default=60.0)
    args = p.parse_args(argv)
    w = workload(args.model, args.mode, args.batch)
    opts = bench_options(w, precision=args.precision)
    variants = [(JaxRunner, "onednn_pool"), (XlaMaxPool, "xla_pool")]
    runners = [runner(w, label, opts, cls=cls, precision=args.precision) for cls, label in variants]
    what = f"{args.model} {args.mode} b{args.batch} {args.precision}"
    run_ab(runners, what, "onednn_pool", args.time_budget)


if __name__ == "__main__":
    main()
