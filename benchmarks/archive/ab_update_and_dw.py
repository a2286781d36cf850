"""A training step now against the same step without this round's two small-batch changes.

    python benchmarks/archive/ab_update_and_dw.py --batch 1 --optimizer pytorch
    python benchmarks/archive/ab_update_and_dw.py --batch 32 --optimizer train
    python benchmarks/archive/ab_update_and_dw.py --model resnet50 --batch 1 \\
        --variants channel_major_1x1

The changes (ResNet-18 CIFAR or ``--model resnet50`` on ImageNet, NHWC, fp32, the shipped
conv table, the step's own compile options):

- ``two_conds``: the optimizer update and the params update in two ``lax.cond``s with the
  gradients checked twice, as before ``train.skip.update_and_apply`` put them in one
  conditional (``cond`` skip branch, the CPU default);
- ``per_offset_dw``: im2col's weight gradient always by per-offset GEMMs and a stack, as
  before ``im2col.weight_grad`` took one GEMM over the patches at small work sizes;
- ``before``: both;
- ``channel_major_1x1``: im2col's 1x1 weight gradient through a channel-major copy of the
  input (the one-GEMM or per-offset forms), as before it contracted the input over its
  rows.

Timed interleaved (``bench.sweep.run_group``); prints each median and the per-round ratio
``variant / now`` (above 1: the change makes the step faster). Each variant's program is
built with the old code patched in for the time of its set-up.
"""

from __future__ import annotations

import argparse
import json

from interleaved_steps import bench_options, median_cell, runner, workload

from layoutlab.bench.jax_runner import JaxRunner
from layoutlab.bench.stats import paired_ratio
from layoutlab.bench.sweep import run_group
from layoutlab.nn.conv_algos import im2col
from layoutlab.train import skip, steps


def _channel_major_weight_grad(x, g, geom, w_shape, preferred):
    if g.shape[0] * g.shape[1] * g.shape[2] <= w_shape[-1]:
        return im2col.one_gemm_weight_grad(x, g, geom, w_shape, preferred)
    return im2col.per_offset_weight_grad(x, g, geom, w_shape, preferred)


def _two_conds(tx, grads, opt_state, params, finite, branch="select"):
    updates, opt_state = tx.update(grads, opt_state, params)
    return skip.apply_if_finite_updates(params, updates, finite, branch), opt_state


PATCHES = {
    "two_conds": ((steps, "update_and_apply", _two_conds),),
    "per_offset_dw": ((im2col, "weight_grad", im2col.per_offset_weight_grad),),
}
PATCHES["before"] = PATCHES["two_conds"] + PATCHES["per_offset_dw"]
PATCHES["channel_major_1x1"] = ((im2col, "weight_grad", _channel_major_weight_grad),)


def _patched(patches):
    class Patched(JaxRunner):
        def setup(self):
            saved = [(mod, name, getattr(mod, name)) for mod, name, _ in patches]
            for mod, name, value in patches:
                setattr(mod, name, value)
            try:
                return super().setup()
            finally:
                for mod, name, value in saved:
                    setattr(mod, name, value)

    return Patched


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--optimizer", default="pytorch", choices=("pytorch", "train"))
    p.add_argument("--variants", default="two_conds,per_offset_dw,before")
    p.add_argument("--time-budget", type=float, default=30.0)
    args = p.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    if unknown := sorted(set(names) - set(PATCHES)):
        p.error(f"unknown variants {unknown}; choose from {', '.join(PATCHES)}")
    w = workload(args.model, "train", args.batch)
    opts = bench_options(w, args.optimizer)
    runners = [runner(w, "now", opts, optimizer=args.optimizer)] + [
        runner(w, name, opts, optimizer=args.optimizer, cls=_patched(PATCHES[name]))
        for name in names
    ]
    rows = run_group(runners, repeats="auto", warmup=2, budget_s=args.time_budget)
    for r in rows:
        print(args.model, args.batch, args.optimizer, r["defaults"], r["status"],
              median_cell(r), r.get("error") or "")  # fmt: skip
    if all(r["status"] == "ok" for r in rows):
        now, *others = (json.loads(r["round_ms"]) for r in rows)
        for name, ms in zip(names, others, strict=True):
            print(f"{name} / now per round:", paired_ratio(ms, now))


if __name__ == "__main__":
    main()
