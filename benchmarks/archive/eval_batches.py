"""A whole evaluation of a test split, in equal batches against full batches plus a remainder.

    python benchmarks/archive/eval_batches.py --model mobilenet_v2 --test-images 10000 --rounds 9 \
        --out benchmarks/results/eval_batches_zen4_cpu/mobilenet_v2

``train.evaluation.evaluate`` now splits the test split into the fewest batches of one size
(at most ``eval_batch_size``; ``eval_batches``) and pads the last one, so the eval step is
one program on the run's eval plan. Before, it ran full batches of ``eval_batch_size`` and
then the remainder (10,000 % 512 = 272 images for CIFAR-10) as a second program, on XLA's
convs (the eval plan's entries are keyed by the full batch's shapes) and replicated on every
device. This times both on one device, as a run on this machine would make them (the
shipped table's eval plan at each one's batch, the run's inference XLA options, a fresh
init: the time does not depend on the weights), 32x32x3 synthetic images in 10 classes:

- the first evaluation, compiles included (each variant's programs compiled in turn);
- whole evaluations after it, in interleaved rounds whose order rotates, each median with
  its 95% interval and the median of the per-round ratios (before / now: above 1, the
  equal batches are faster);
- the metrics of both: the same images, so the same accuracy unless a conv algorithm flips
  an argmax, and losses equal to float32 rounding.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import numpy as np

from layoutlab.bench.machine import finish_machine_info, machine_info
from layoutlab.bench.stats import OtherLoad, dispersion, median_interval, paired_ratio
from layoutlab.bench.timing import interleaved_rounds
from layoutlab.data import epoch_batches
from layoutlab.data.synthetic import make_synthetic
from layoutlab.train.config import TrainConfig, validate
from layoutlab.train.evaluation import eval_batches, evaluate, jit_eval_step, run_eval_batch
from layoutlab.train.program import INIT_COMPILER_OPTIONS, build_program
from layoutlab.train.run_plan import abstract_model, planned
from layoutlab.train.sharding import assemble, make_shardings
from layoutlab.train.spec import InputSpec, resolve_spec


def evaluate_before(eval_step, state, dataset, spec, shard) -> dict:
    """``evaluate`` as it was (one device): full batches of ``eval_batch_size``, then the
    remainder at its own size."""
    total, size = None, spec.eval_batch_size
    batches = epoch_batches(dataset, "test", size, layout=spec.config.layout, shuffle=False,
                            drop_last=False)  # fmt: skip
    for local in batches:
        out = jax.device_get(eval_step(state, *assemble(shard.batch, local, local[1].shape[0])))
        total = out if total is None else {k: total[k] + out[k] for k in total}
    count = int(total["count"])
    return {"test_loss": float(total["loss_sum"]) / count,
            "test_accuracy": int(total["correct"]) / count}  # fmt: skip


def _variant(spec, dataset, inputs, eval_batch, shard):
    """The eval step and state of ``spec`` planned as a run is, its eval plan at
    ``eval_batch``."""
    spec = planned(spec, inputs, 1, None, None, abstract_model(spec, inputs), eval_batch)
    program = build_program(spec, inputs, "cpu")
    state = jax.jit(program.init, compiler_options=INIT_COMPILER_OPTIONS)()
    step = jit_eval_step(program.eval_step, spec, shard)
    return step, jax.device_put(state, shard.replicated)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mobilenet_v2")
    p.add_argument("--stem", default="none", help="a ResNet's stem; none: a model without")
    p.add_argument("--test-images", type=int, default=10_000)
    p.add_argument("--eval-batch", type=int, default=512)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--out", required=True, help="path without suffix: writes .json and .md")
    args = p.parse_args(argv)
    machine = machine_info("cpu")
    kwargs = {} if args.stem == "none" else {"stem": args.stem}
    dataset = make_synthetic((32, 32, 3), 10, 2 * args.test_images, test_fraction=0.5)
    assert dataset.split("test")[1].shape[0] == args.test_images
    config = validate(TrainConfig(model=args.model, model_kwargs=kwargs, data=dataset.name,
                                  batch_size=32, eval_batch_size=args.eval_batch,
                                  data_parallel=False), 1)  # fmt: skip
    inputs = InputSpec.of(dataset, 32)
    shard = make_shardings(False)
    spec = resolve_spec(config)
    now_batch = run_eval_batch(dataset, spec)
    made = {
        "before": (evaluate_before, args.eval_batch),
        "equal batches": (evaluate, now_batch),
    }
    calls, first, metrics = {}, {}, {}
    for name, (fn, eval_batch) in made.items():
        step, state = _variant(spec, dataset, inputs, eval_batch, shard)

        def call(fn=fn, step=step, state=state):
            return fn(step, state, dataset, spec, shard)

        t0 = time.perf_counter()
        metrics[name] = call()
        first[name] = time.perf_counter() - t0
        calls[name] = call
        print(f"{name}: first evaluation {first[name]:.1f} s, {metrics[name]}", flush=True)
    meter = OtherLoad()
    rounds = interleaved_rounds(calls, args.rounds, warmup=0, rotate=True)
    others = meter.cores()
    rows = []
    for name, ms in rounds.items():
        ci = median_interval(ms)
        ratio = None if name == "before" else paired_ratio(rounds["before"], ms)
        rows.append({
            "name": name, "eval_batch": made[name][1], "first_s": first[name],
            "median_ms": float(np.median(ms)), "ci": None if ci is None else [ci.low, ci.high],
            "dispersion": dispersion(ms), "rounds_ms": ms, **metrics[name],
            "before_over_this": None if ratio is None else list(ratio),
        })  # fmt: skip
    result = {"machine": finish_machine_info(machine), "model": args.model, "kwargs": kwargs,
              "test_images": args.test_images, "eval_batch_size": args.eval_batch,
              "other_cores": others, "rows": rows}  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    n, size = args.test_images, args.eval_batch
    lines = [
        f"{args.model} {kwargs or ''}: {n} test images, eval_batch_size {size}, "
        f"other processes {others:.2f} cores",
        "",
        "| evaluate | batches | first evaluation s | evaluation ms median [95%] | IQR/median "
        "| before / this [95%] | test loss | test accuracy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        shape = (f"{n // size} x {size} + {n % size}" if r["name"] == "before"
                 else "{} x {}".format(*eval_batches(n, size)))  # fmt: skip
        ci = "" if r["ci"] is None else " [{:.0f}, {:.0f}]".format(*r["ci"])
        ratio = r["before_over_this"]
        ratio = "" if ratio is None else "{:.2f} [{:.2f}, {:.2f}]".format(*ratio)
        lines.append(
            f"| {r['name']} | {shape} | {r['first_s']:.1f} | {r['median_ms']:.0f}{ci} "
            f"| {r['dispersion']:.1%} | {ratio} | {r['test_loss']:.6f} | {r['test_accuracy']} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
