"""A ``mixed_bf16`` step on a CPU without bfloat16 units with its convs widened to float32
(the default there: ``default_plan.widened_dtype``) against the same step computing them in
bfloat16 on XLA's convs, as before, and against the float32 step, interleaved.

    python benchmarks/ab_widened_bf16.py --model resnet18 --batch 32 --mode train

All three run the shipped conv table (NHWC, SGD with momentum, each step's own compile
options, ``bench.sweep.run_group``); ``bf16_narrow`` is set up, and its compile options
derived, with ``default_plan.WIDEN_KINDS`` emptied. Prints each median and the per-round
ratios ``label / bf16_widened`` (above 1: the widened step is faster). On a CPU with
bfloat16 units (or off AVX-512) nothing is widened and the two bfloat16 steps are the same.
"""

from __future__ import annotations

import argparse
import contextlib

from interleaved_steps import bench_options, run_ab, runner, workload

from layoutlab.bench.jax_runner import JaxRunner
from layoutlab.nn.conv_algos import default_plan


@contextlib.contextmanager
def _narrow():
    saved = default_plan.WIDEN_KINDS
    default_plan.WIDEN_KINDS = ()
    try:
        yield
    finally:
        default_plan.WIDEN_KINDS = saved


class Narrow(JaxRunner):
    """A runner whose conv plan is made with nothing widened."""

    def setup(self):
        with _narrow():
            return super().setup()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18", help="resnet18 (CIFAR stem) or resnet50")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--mode", default="train", choices=("train", "infer"))
    p.add_argument("--time-budget", type=float, default=30.0)
    args = p.parse_args(argv)
    w = workload(args.model, args.mode, args.batch)
    with _narrow():
        narrow = bench_options(w, precision="mixed_bf16")
    runners = [
        runner(w, "fp32", bench_options(w, precision="fp32"), precision="fp32"),
        runner(w, "bf16_narrow", narrow, cls=Narrow, precision="mixed_bf16"),
        runner(w, "bf16_widened", bench_options(w, precision="mixed_bf16"), precision="mixed_bf16"),
    ]
    what = f"{args.model} {args.mode} b{args.batch}"
    run_ab(runners, what, "bf16_widened", args.time_budget)


if __name__ == "__main__":
    main()
