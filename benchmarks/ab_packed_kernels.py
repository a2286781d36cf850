"""An inference step with oneDNN's conv kernels packed once (the default of ``bench`` and
``predict``: ``nn.conv_algos.onednn_packed``) against the same step reordering each kernel
inside every call, interleaved.

    python benchmarks/ab_packed_kernels.py --model resnet18 --batch 1 --precision mixed_bf16

Both run the shipped conv table (NHWC, the step's own compile options,
``bench.sweep.run_group``) and give the same bits. Prints each median and the per-round
ratio ``unpacked / packed`` (above 1: packing makes the step faster).
"""

from __future__ import annotations

import argparse

from interleaved_steps import bench_options, run_ab, runner, workload

from layoutlab.bench.jax_runner import JaxRunner


class Unpacked(JaxRunner):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, pack_convs=False, **kwargs)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18", help="resnet18 (CIFAR stem) or resnet50")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--precision", default="mixed_bf16")
    p.add_argument("--time-budget", type=float, default=60.0)
    args = p.parse_args(argv)
    w = workload(args.model, "infer", args.batch)
    opts = bench_options(w, precision=args.precision)
    variants = [(JaxRunner, "packed"), (Unpacked, "unpacked")]
    runners = [runner(w, label, opts, cls=cls, precision=args.precision) for cls, label in variants]
    what = f"{args.model} infer b{args.batch} {args.precision}"
    rows = run_ab(runners, what, "packed", args.time_budget)
    print("packed kernels:", [r.get("packed_kernels") for r in rows])


if __name__ == "__main__":
    main()
