"""A training step whose non-finite skip branches with ``lax.cond`` against ``jnp.where``.

    python benchmarks/skip_branch.py --model resnet18 --batch 1 --optimizer pytorch
    python benchmarks/skip_branch.py --model vgg11_bn --batch 16

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

from layoutlab.bench.cases import JaxCase, make_workload
from layoutlab.bench.jax_runner import JaxRunner
from layoutlab.bench.stats import paired_ratio
from layoutlab.bench.sweep import run_group
from layoutlab.fast_defaults import cpu_fast_options
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
    kwargs = {"stem": "cifar"} if args.model.startswith("resnet") else {}
    w = make_workload(args.model, kwargs, (32, 32, 3), 10, "train", args.batch)
    opts = tuple(sorted(cpu_fast_options("train", args.optimizer, batch=args.batch).items()))
    runners = [
        cls(
            JaxCase(
                w,
                "NHWC",
                "fp32",
                "auto",
                "channels_last",
                opts,
                label,
                conv_tune="never",
                activation_storage="channels_last",
                optimizer=args.optimizer,
            ),
            backend="cpu",
            steps=20,
        )  # fmt: skip
        for cls, label in ((JaxRunner, "cond"), (SelectRunner, "select"))
    ]
    rows = run_group(runners, repeats="auto", warmup=2, budget_s=args.time_budget)
    for r in rows:
        ms = [r.get(k) or 0 for k in ("step_ms_median", "step_ms_ci_low", "step_ms_ci_high")]
        print(args.model, args.batch, args.optimizer, r["defaults"], r["status"],
              f"{ms[0]:.1f} [{ms[1]:.1f}, {ms[2]:.1f}]", r.get("error") or "")  # fmt: skip
    if all(r["status"] == "ok" for r in rows):
        cond, select = (json.loads(r["round_ms"]) for r in rows)
        print("select / cond per round:", paired_ratio(select, cond))


if __name__ == "__main__":
    main()
