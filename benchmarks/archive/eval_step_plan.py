"""A run's eval step on its training conv plan and on its eval plan, interleaved.

    python benchmarks/archive/eval_step_plan.py --model mobilenet_v2 --stem none --rounds 10 \
        --out benchmarks/results/eval_step_plan_zen3_cpu/mobilenet_v2

A training run on the shipped table's plan stores, besides ``conv_plan`` (the table's
training rules keyed by the conv shapes at the training batch), ``eval_conv_plan``: the
table's inference rules at the eval batch (``train.run_plan.planned``). Before it, the eval
step ran the training plan, whose entries match no conv at another batch, so every conv
ran XLA's. This times both eval steps (``make_eval_step``, the run's inference XLA
options, the same restored state and batch) in interleaved rounds, rotating their order
each round, and reports each median with its 95% interval and the median of the per-round
ratios (training plan / eval plan: above 1, the eval plan is faster).

The run is planned as ``layoutlab train`` plans it on this machine (training batch 32, the
eval batch ``--eval-batch``, default 512 as ``eval_batch_size``'s default) and its weights
are a fresh init: the time does not depend on them. 32x32x3 inputs with 10 classes.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from layoutlab.bench.machine import finish_machine_info, machine_info
from layoutlab.bench.stats import OtherLoad, dispersion, median_interval, paired_ratio
from layoutlab.bench.timing import interleaved_rounds
from layoutlab.infer.load import Run
from layoutlab.nn.conv_config import running_algorithms
from layoutlab.train.config import TrainConfig
from layoutlab.train.program import INIT_COMPILER_OPTIONS, build_model
from layoutlab.train.run_plan import abstract_model, planned
from layoutlab.train.spec import InputSpec, resolve_spec
from layoutlab.train.state import split_model
from layoutlab.train.steps import make_eval_step


def _algorithms(defs, params, model_state, x) -> str:
    """How many convs run each algorithm on ``x`` (``nn.conv_config.running_algorithms``)."""
    model = nnx.merge(defs.eval, params, model_state)
    counts = Counter(running_algorithms(model, x).values())
    return ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mobilenet_v2")
    p.add_argument("--stem", default="none", help="a ResNet's stem; none: a model without")
    p.add_argument("--eval-batch", type=int, default=512)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--out", required=True, help="path without suffix: writes .json and .md")
    args = p.parse_args(argv)
    machine = machine_info("cpu")
    kwargs = {} if args.stem == "none" else {"stem": args.stem}
    config = TrainConfig(model=args.model, model_kwargs=kwargs, data="synthetic:32x32x3:10:64",
                         batch_size=32, eval_batch_size=args.eval_batch)  # fmt: skip
    inputs = InputSpec(image_shape=(32, 32, 3), num_classes=10, batch_size=32)
    spec = resolve_spec(config)
    spec = planned(spec, inputs, 1, None, None, abstract_model(spec, inputs), args.eval_batch)
    config = spec.config
    defs = split_model(nnx.eval_shape(lambda: build_model(spec, inputs)))[0]
    params, model_state = jax.jit(
        lambda: split_model(build_model(spec, inputs))[1:], compiler_options=INIT_COMPILER_OPTIONS
    )()
    run = Run(Path("."), config, None, 0, defs, params, model_state)
    images, labels = inputs.batch(spec.layout, args.eval_batch)
    rng = np.random.default_rng(0)
    x = jax.device_put(rng.standard_normal(images.shape, np.float32))
    y = jax.device_put(rng.integers(0, 10, labels.shape).astype(np.int32))
    options = spec.compile_options("infer") or None
    state = run.state()
    steps = {
        "training plan": jax.jit(make_eval_step(run.defs), compiler_options=options),
        "eval plan": jax.jit(make_eval_step(run.eval_defs), compiler_options=options),
    }
    calls = {k: (lambda f=f: jax.block_until_ready(f(state, x, y))) for k, f in steps.items()}
    plans = {
        "training plan": _algorithms(run.defs, params, model_state, x),
        "eval plan": _algorithms(run.eval_defs, params, model_state, x),
    }
    meter = OtherLoad()
    rounds = interleaved_rounds(calls, args.rounds, warmup=1, rotate=True)
    others = meter.cores()
    rows = []
    for name, ms in rounds.items():
        ci = median_interval(ms)
        ratio = paired_ratio(ms, rounds["eval plan"])
        rows.append({
            "name": name, "algorithms": plans[name], "median_ms": float(np.median(ms)),
            "ci": None if ci is None else [ci.low, ci.high], "dispersion": dispersion(ms),
            "vs_eval_plan": None if ratio is None else list(ratio), "rounds_ms": ms,
        })  # fmt: skip
    result = {"machine": finish_machine_info(machine), "model": args.model, "kwargs": kwargs,
              "eval_batch": args.eval_batch, "other_cores": others, "rows": rows}  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        f"{args.model} {kwargs or ''} eval step at batch {args.eval_batch}, "
        f"other processes {others:.2f} cores",
        "",
        "| conv plan | what the convs run | ms median [95%] | IQR/median "
        "| training / eval plan [95%] |",
        "|---|---|---|---|---|",
        *(
            f"| {r['name']} | {r['algorithms']} | {r['median_ms']:.1f} "
            + ("" if r["ci"] is None else "[{:.1f}, {:.1f}]".format(*r["ci"]))
            + f" | {r['dispersion']:.1%} | "
            + (
                ""
                if r["vs_eval_plan"] is None
                else "{:.2f} [{:.2f}, {:.2f}]".format(*r["vs_eval_plan"])
            )  # fmt: skip
            + " |"
            for r in rows
        ),
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
