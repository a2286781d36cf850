"""A whole step with the shipped conv table against the same step with one algorithm on
every conv, interleaved.

    python benchmarks/ab_conv_algorithm.py --model resnet50 --batch 16 --mode infer --algo onednn

Both programs are built as ``layoutlab bench`` builds them (``interleaved_steps.runner``:
NHWC, HWIO kernels, SGD with momentum for a training step, the step's own compile options for
``--precision``); the second sets every conv to ``--algo`` as ``--conv-algo`` does. Prints
each median and the per-round ratio ``table / algo`` (above 1: the algorithm everywhere makes
the step faster than the table's choices).
"""

from __future__ import annotations

import argparse

from interleaved_steps import bench_options, run_ab, runner, workload


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet50", help="a registry name (interleaved_steps)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--mode", default="infer", choices=("train", "infer"))
    p.add_argument("--precision", default="fp32", help="a policy name: fp32 or mixed_bf16")
    p.add_argument("--algo", default="onednn", help="a conv algorithm name")
    p.add_argument("--time-budget", type=float, default=30.0)
    args = p.parse_args(argv)
    w = workload(args.model, args.mode, args.batch)
    opts = bench_options(w, precision=args.precision)
    runners = [
        runner(w, "table", opts, precision=args.precision),
        runner(w, args.algo, opts, algo=args.algo, precision=args.precision),
    ]
    what = f"{args.model} {args.mode} b{args.batch} {args.precision}"
    run_ab(runners, what, args.algo, args.time_budget)


if __name__ == "__main__":
    main()
