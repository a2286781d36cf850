"""A whole mixed_bf16 training step with oneDNN's bfloat16 weight-gradient kernel from batch 8
(the shipped rule) against the rule before it, interleaved.

    python benchmarks/ab_bf16_weight_gradient.py --model resnet18 --batch 32
    python benchmarks/ab_bf16_weight_gradient.py --model resnet50 --batch 16 --time-budget 60

The rule before: a bfloat16 weight gradient of at most 1,024 output pixels, or at most 64 per
image, or of a strided spatial kernel, ran oneDNN's float32 primitive on activations converted
to float32, at every batch. Now that holds below batch 8 only (few-channel convs keep float32
at every batch). The second program is set up with the old rule (``BF16_WEIGHT_GRADIENT_MIN_
BATCH`` past any batch) for the time of its set-up; both run the shipped conv table
(``bench.sweep.run_group``, NHWC, SGD with momentum, the step's own compile options). Prints
each median and the per-round ratio ``old / new`` (above 1: the new rule is faster).
"""

from __future__ import annotations

import argparse

from interleaved_steps import bench_options, run_ab, runner, workload

from layoutlab.bench.jax_runner import JaxRunner
from layoutlab.nn.conv_algos import onednn


class OldRule(JaxRunner):
    def setup(self):
        saved = onednn.BF16_WEIGHT_GRADIENT_MIN_BATCH
        onednn.BF16_WEIGHT_GRADIENT_MIN_BATCH = 2**31
        try:
            return super().setup()
        finally:
            onednn.BF16_WEIGHT_GRADIENT_MIN_BATCH = saved


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18", help="resnet18 (CIFAR, 32x32) or resnet50")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--time-budget", type=float, default=40.0)
    args = p.parse_args(argv)
    w = workload(args.model, "train", args.batch)
    opts = bench_options(w, precision="mixed_bf16")
    runners = [
        runner(w, label, opts, cls=cls, precision="mixed_bf16")
        for cls, label in ((JaxRunner, "new"), (OldRule, "old"))
    ]
    run_ab(runners, f"{args.model} b{args.batch}", "new", args.time_budget)


if __name__ == "__main__":
    main()
