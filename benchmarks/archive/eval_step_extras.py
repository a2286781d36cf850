"""What the confusion matrix and top-5 sums cost the training loop's evaluations.

    python benchmarks/archive/eval_step_extras.py --model small_cnn --stem none --image 8x8x1 \
        --classes 10 --test-images 400 --rounds 9 --out benchmarks/results/DIR/small_cnn

The eval step (``train.steps.make_eval_step``) sums the confusion matrix and, past 5
classes, the top-5 hits beside loss and accuracy, so that ``layoutlab evaluate`` runs the
training loop's own program once per image. The training loop does not record those sums;
this times what they add to its evaluations: a one-step run on synthetic images (made as
``train_and_evaluate`` makes it), then its whole test split through ``eval_sums`` with the
eval step as it was (three sums, ``evaluate_once.old_eval_step``) and as it is, jitted as
the loop jits it, in interleaved rounds whose order rotates (the first round unmeasured:
the compiles). ``this / before`` is the median of the per-round ratios with its 95%
interval (above 1: the sums cost time).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import jax
import numpy as np
from evaluate_once import old_eval_step

from layoutlab.bench.machine import finish_machine_info, machine_info
from layoutlab.bench.stats import OtherLoad, median_interval, paired_ratio
from layoutlab.bench.timing import interleaved_rounds
from layoutlab.infer.load import open_run
from layoutlab.train.config import TrainConfig
from layoutlab.train.evaluation import eval_sums, jit_eval_step
from layoutlab.train.loop import train_and_evaluate
from layoutlab.train.program import class_axis
from layoutlab.train.sharding import make_shardings
from layoutlab.train.steps import make_eval_step


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="small_cnn")
    p.add_argument("--stem", default="none", help="a ResNet's stem; none: a model without")
    p.add_argument("--image", default="8x8x1", help="HxWxC of the synthetic images")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--test-images", type=int, default=400)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--out", required=True, help="path without suffix: writes .json and .md")
    args = p.parse_args(argv)
    machine = machine_info("cpu")
    kwargs = {} if args.stem == "none" else {"stem": args.stem}
    # synthetic's N is both splits; a fifth of it is the test split.
    data = f"synthetic:{args.image}:{args.classes}:{5 * args.test_images}"
    workdir = Path(tempfile.mkdtemp(prefix="eval_step_extras-"))
    config = TrainConfig(model=args.model, model_kwargs=kwargs, data=data, num_steps=1,
                         data_parallel=False)  # fmt: skip
    train_and_evaluate(config, workdir, quiet=True)
    run = open_run(workdir)
    shard = make_shardings(False)
    state = jax.device_put(run.state(), shard.replicated)
    steps = {
        "three sums (before)": old_eval_step(run.eval_defs),
        "with confusion and top-5 (now)": make_eval_step(run.eval_defs, class_axis(run.spec)),
    }
    calls = {}
    for name, step in steps.items():
        jitted = jit_eval_step(step, run.spec, shard)
        calls[name] = lambda s=jitted: eval_sums(s, state, run.dataset, run.spec, shard)
    meter = OtherLoad()
    rounds = interleaved_rounds(calls, args.rounds, warmup=1, rotate=True)
    others = meter.cores()
    before, now = rounds.values()
    ratio = paired_ratio(now, before)  # now / before, round by round
    rows = [{"name": name, "median_ms": float(np.median(ms)), "rounds_ms": ms,
             "ci": list(median_interval(ms) or [])} for name, ms in rounds.items()]  # fmt: skip
    this_over_before = None if ratio is None else list(ratio)
    result = {"machine": finish_machine_info(machine), "model": args.model, "kwargs": kwargs,
              "data": data, "other_cores": others, "rows": rows,
              "this_over_before": this_over_before}  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    shown = "" if this_over_before is None else "{:.3f} [{:.3f}, {:.3f}]".format(*this_over_before)
    lines = [
        f"{args.model} {kwargs or ''} on {data}: {args.test_images} test images, other "
        f"processes {others:.2f} cores",
        "",
        "| eval step | whole test split ms, median | this / before [95%] |",
        "|---|---|---|",
        f"| three sums (before) | {rows[0]['median_ms']:.1f} | |",
        f"| with confusion and top-5 (now) | {rows[1]['median_ms']:.1f} | {shown} |",
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
