"""A whole mixed_bf16 (or fp32) training step with BatchNorm on oneDNN's primitive (the
default where the extension has it) against the same step with XLA's BatchNorm, interleaved.

    python benchmarks/ab_batch_norm_onednn.py --model resnet50 --batch 16 --time-budget 90
    python benchmarks/ab_batch_norm_onednn.py --model resnet18 --batch 32

The second program is set up with every BatchNorm on XLA's ops and its max pools as the
first's (``interleaved_steps.with_layer_impls``: ``--layer-impl xla`` would move both);
both run the shipped conv table (``bench.sweep.run_group``, NHWC, SGD with momentum,
the step's own compile options). Prints each median and the per-round ratio ``xla / onednn``
(above 1: oneDNN's BatchNorm makes the step faster); ``--unfused`` adds a third program whose
BatchNorms run oneDNN's primitive with the ReLU after them left to XLA; ``--onednn-float32``
(with ``--precision fp32``) hands float32 activations to oneDNN's BatchNorm as well.
"""

from __future__ import annotations

import argparse

import jax
from interleaved_steps import bench_options, run_ab, runner, with_layer_impls, workload

from layoutlab.bench.jax_runner import JaxRunner
from layoutlab.models import resnet
from layoutlab.nn import norm


class UnfusedRelu(JaxRunner):
    """oneDNN's BatchNorm with the ResNets' ReLU left to XLA (as before the fusion)."""

    def setup(self):
        saved = resnet.batch_norm_relu
        resnet.batch_norm_relu = lambda bn, x: jax.nn.relu(bn(x))
        try:
            return super().setup()
        finally:
            resnet.batch_norm_relu = saved


class Float32Onednn(JaxRunner):
    """oneDNN's BatchNorm for float32 activations too (``nn.norm.ONEDNN_NORM_DTYPES``)."""

    def setup(self):
        saved = norm.ONEDNN_NORM_DTYPES
        norm.ONEDNN_NORM_DTYPES = ("bfloat16", "float32")
        try:
            return super().setup()
        finally:
            norm.ONEDNN_NORM_DTYPES = saved


XlaBatchNorm = with_layer_impls(batch_norm="xla")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18", help="resnet18 (CIFAR, 32x32) or resnet50")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--precision", default="mixed_bf16")
    p.add_argument("--time-budget", type=float, default=40.0)
    p.add_argument("--unfused", action="store_true", help="a third program: ReLU left to XLA")
    p.add_argument(
        "--onednn-float32", action="store_true", help="oneDNN's BatchNorm for float32 too"
    )
    args = p.parse_args(argv)
    w = workload(args.model, "train", args.batch)
    opts = bench_options(w, precision=args.precision)
    first = Float32Onednn if args.onednn_float32 else JaxRunner
    variants = [(first, "onednn_bn"), (XlaBatchNorm, "xla_bn")]
    if args.unfused:
        variants.append((UnfusedRelu, "onednn_bn_unfused"))
    runners = [runner(w, label, opts, cls=cls, precision=args.precision) for cls, label in variants]
    run_ab(runners, f"{args.model} b{args.batch} {args.precision}", "onednn_bn", args.time_budget)


if __name__ == "__main__":
    main()
