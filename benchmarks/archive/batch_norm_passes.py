"""Training-mode BatchNorm's two forms against each other, alone and in whole steps.

    python benchmarks/archive/batch_norm_passes.py [--shape 16,56,56,256] [--rounds 15]
    python benchmarks/archive/batch_norm_passes.py --model resnet50 --batch 16 [--time-budget 60]
    taskset -c 0 python benchmarks/archive/batch_norm_passes.py ...   # on one core

``centred`` (``nn.norm.batch_norm_train_centred``, what every BatchNorm ran before the
affine form) computes the forward ``(x - mean) * (rstd * scale) + bias``, with ``x - mean``
shared by the variance and the output, and a backward through ``xhat = (x - mean) * rstd``,
shared by a reduction and the input gradient, plus the statistics' cotangent terms always
computed (zeros in BatchNorm). XLA:CPU's YNNPACK fusions write such a shared value out and
read it back in full. ``affine`` (``nn.norm.batch_norm_train_affine``) shares none.

Without ``--model``: BatchNorm followed by ReLU, forward and backward (``jax.vjp``) on one
activation of ``--shape`` (NHWC), both compiled with the XLA:CPU options of a training step
at the shape's batch (none at batch 1 on AVX-512),
timed in interleaved rounds; prints each median and the per-round ratio centred / affine
(above 1 the affine form is faster), and the number of fusions each compiles to.
With ``--model``: the whole training step of the model (NHWC, fp32, SGD with momentum, the
defaults' conv table and options) as shipped (``batch_norm_train`` picks the form by size,
``AFFINE_MIN_ELEMENTS``) and with the centred form everywhere, interleaved
(``bench.sweep.run_group``); ``--affine-everywhere`` replaces the shipped choice by the
affine form everywhere.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

from layoutlab.bench.stats import paired_ratio
from layoutlab.bench.timing import interleaved_rounds
from layoutlab.fast_defaults import cpu_fast_options
from layoutlab.nn import norm


def _layer(args) -> None:
    shape = tuple(int(v) for v in args.shape.split(","))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal(shape, np.float32) * 2 + 0.5)
    scale, bias = (jnp.asarray(rng.standard_normal(shape[-1:], np.float32)) for _ in range(2))
    g = jnp.asarray(rng.standard_normal(shape, np.float32))
    axes = tuple(range(len(shape) - 1))

    def program(fn):
        def run(x, s, b, g):
            y, vjp = jax.vjp(lambda x, s, b: jax.nn.relu(fn(x, s, b, axes, 1e-5)[0]), x, s, b)
            return y, vjp(g)

        # The options a training step at this batch (the leading axis) compiles with.
        options = cpu_fast_options("train", "pytorch", batch=shape[0])
        return jax.jit(run).lower(x, scale, bias, g).compile(compiler_options=options)

    compiled = {"centred": program(norm.batch_norm_train_centred),
                "affine": program(norm.batch_norm_train_affine)}  # fmt: skip
    calls = {name: (lambda c=c: jax.block_until_ready(c(x, scale, bias, g)))
             for name, c in compiled.items()}  # fmt: skip
    times = interleaved_rounds(calls, args.rounds, warmup=2)
    for name, c in compiled.items():
        fusions = c.as_text().count(" fusion(")
        print(f"{name:8s} {np.median(times[name]):8.2f} ms  ({fusions} fusions)")
    print("centred / affine per round:", paired_ratio(times["centred"], times["affine"]))


def _step(args) -> None:
    from interleaved_steps import median_cell, runner, workload

    from layoutlab.bench.jax_runner import JaxRunner
    from layoutlab.bench.sweep import run_group

    def traced_with(form):
        class With(JaxRunner):
            def setup(self):  # the step is traced here
                shipped, norm.batch_norm_train = norm.batch_norm_train, form
                try:
                    return super().setup()
                finally:
                    norm.batch_norm_train = shipped

        return With

    w = workload(args.model, "train", args.batch)
    opts = cpu_fast_options("train", "pytorch", batch=args.batch)
    first = ("affine", traced_with(norm.batch_norm_train_affine)) if args.affine_everywhere \
        else ("shipped", JaxRunner)  # fmt: skip
    runners = [
        runner(w, first[0], opts, cls=first[1]),
        runner(w, "centred", opts, cls=traced_with(norm.batch_norm_train_centred)),
    ]
    rows = run_group(runners, repeats="auto", warmup=2, budget_s=args.time_budget)
    for r in rows:
        print(args.model, args.batch, r["defaults"], r["status"], median_cell(r),
              r.get("error") or "")  # fmt: skip
    if all(r["status"] == "ok" for r in rows):
        shipped, centred = (json.loads(r["round_ms"]) for r in rows)
        print(f"centred / {first[0]} per round:", paired_ratio(centred, shipped))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="16,56,56,256")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--model", default=None, help="resnet18 (CIFAR) or resnet50 (ImageNet)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--time-budget", type=float, default=60.0)
    p.add_argument("--affine-everywhere", action="store_true")
    args = p.parse_args(argv)
    (_step if args.model else _layer)(args)


if __name__ == "__main__":
    main()
