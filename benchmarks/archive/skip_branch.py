"""A training step whose non-finite skip branches with ``lax.cond`` against ``jnp.where``.

    python benchmarks/archive/skip_branch.py --model resnet18 --batch 1 --optimizer pytorch
    python benchmarks/archive/skip_branch.py --model vgg11_bn --batch 16

Both programs are the same training step (NHWC, fp32, the shipped conv table, the step's
own compile options), but for how a step with non-finite gradients keeps the params and
optimizer state (``train.skip``): ``"cond"`` (the CPU default) or ``"select"``. Timed
interleaved (``bench.sweep.run_group``); prints each median and the per-round ratio
``select / cond`` (above 1: cond is faster). The select program is built with
``default_skip_branch`` answering ``"select"`` for the time of its set-up.
"""

from __future__ import annotations

import argparse
import json

from interleaved_steps import bench_options, median_cell, runner, workload

from layoutlab.bench.jax_runner import JaxRunner
from layoutlab.bench.stats import paired_ratio
from layoutlab.bench.sweep import run_group
from layoutlab.train import program


class SelectRunner(JaxRunner):
    def setup(self):
        saved = program.default_skip_branch
        program.default_skip_branch = lambda backend=None: "select"
        try:
            return super().setup()
        finally:
            program.default_skip_branch = saved


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18", help="resnet18 (CIFAR stem) or vgg11_bn")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--optimizer", default="pytorch", choices=("pytorch", "train"))
    p.add_argument("--time-budget", type=float, default=15.0)
    args = p.parse_args(argv)
    w = workload(args.model, "train", args.batch)
    opts = bench_options(w, args.optimizer)
    runners = [
        runner(w, label, opts, optimizer=args.optimizer, cls=cls)
        for cls, label in ((JaxRunner, "cond"), (SelectRunner, "select"))
    ]
    rows = run_group(runners, repeats="auto", warmup=2, budget_s=args.time_budget)
    for r in rows:
        print(args.model, args.batch, args.optimizer, r["defaults"], r["status"],
              median_cell(r), r.get("error") or "")  # fmt: skip
    if all(r["status"] == "ok" for r in rows):
        cond, select = (json.loads(r["round_ms"]) for r in rows)
        print("select / cond per round:", paired_ratio(select, cond))


if __name__ == "__main__":
    main()
