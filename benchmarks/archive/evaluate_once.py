"""`layoutlab evaluate` with one program against the forward and the eval step side by side.

    python benchmarks/archive/evaluate_once.py --model resnet18 --stem cifar --test-images 2000 \
        --rounds 6 --out benchmarks/results/evaluate_once_zen4_cpu/resnet18_cifar

``infer.evaluate.evaluate_run`` now takes the confusion matrix and the top-5 count from the
eval step's own sums (``train.steps.make_eval_step``), so every test image goes through the
model once. Before, it ran a second program beside the eval step, the eval-mode forward, for
the logits the extras were computed from on the host: two forwards per image. This makes a
run as ``layoutlab train`` makes it (one step on synthetic 32x32x3 images in 10 classes, so
the run's own eval plan and XLA options), then times on one device:

- the first evaluation, compiles included (each variant's programs compiled in turn);
- whole evaluations after it, in interleaved rounds whose order rotates, each median with
  its 95% interval and the median of the per-round ratios (before / now: above 1, one
  program is faster);
- that both report the same: loss, accuracy, top-5 accuracy, confusion matrix.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from layoutlab.bench.machine import finish_machine_info, machine_info
from layoutlab.bench.stats import OtherLoad, dispersion, median_interval, paired_ratio
from layoutlab.bench.timing import interleaved_rounds
from layoutlab.infer.evaluate import evaluate_run, on_current_eval_plan
from layoutlab.infer.load import open_run
from layoutlab.train.config import TrainConfig
from layoutlab.train.evaluation import eval_sums, jit_eval_step, record_metrics
from layoutlab.train.loop import train_and_evaluate
from layoutlab.train.sharding import make_shardings
from layoutlab.train.steps import TOP_K, make_forward


def old_eval_step(defs):
    """The eval step as it was: loss, correct and count only."""

    def step(state, images, labels):
        model = nnx.merge(defs.eval, state.params, state.model_state)
        logits = model(images).astype(jnp.float32)
        real = labels >= 0
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels, 0))
        return {
            "loss_sum": jnp.sum(jnp.where(real, losses, 0.0)),
            "correct": jnp.sum((real & (jnp.argmax(logits, axis=-1) == labels)).astype(jnp.int32)),
            "count": jnp.sum(real.astype(jnp.int32)),
        }

    return step


def evaluate_before(run) -> dict:
    """``evaluate_run`` as it was: the eval step, and the forward beside it for the logits the
    extras come from (computed on the host)."""
    shard = make_shardings(run.config.data_parallel)
    run = on_current_eval_plan(run, shard.num_devices)
    eval_step = jit_eval_step(old_eval_step(run.eval_defs), run.spec, shard)
    forward = jit_eval_step(make_forward(run.eval_defs), run.spec, shard)
    logits, labels = [], []

    def step_and_logits(state, images, batch_labels):
        batch = np.asarray(jax.device_get(batch_labels))
        real = batch >= 0
        logits.append(np.asarray(jax.device_get(forward(state, images)), np.float32)[real])
        labels.append(batch[real])
        return eval_step(state, images, batch_labels)

    state = jax.device_put(run.state(), shard.replicated)
    metrics = record_metrics(eval_sums(step_and_logits, state, run.dataset, run.spec, shard))
    logits, labels = np.concatenate(logits), np.concatenate(labels)
    classes = run.dataset.num_classes
    confusion = np.zeros((classes, classes), np.int64)
    np.add.at(confusion, (labels, np.argmax(logits, axis=-1)), 1)
    top = np.argsort(-logits, axis=-1, kind="stable")[:, :TOP_K]
    return {
        **metrics,
        "confusion": confusion.tolist(),
        f"test_top{TOP_K}_accuracy": float(np.mean(np.any(top == labels[:, None], -1))),
    }


def _reported(result: dict) -> dict:
    keys = ("test_loss", "test_accuracy", f"test_top{TOP_K}_accuracy", "confusion")
    return {k: result[k] for k in keys}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--stem", default="cifar", help="a ResNet's stem; none: a model without")
    p.add_argument("--test-images", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--out", required=True, help="path without suffix: writes .json and .md")
    args = p.parse_args(argv)
    machine = machine_info("cpu")
    kwargs = {} if args.stem == "none" else {"stem": args.stem}
    # synthetic's N is both splits; a fifth of it is the test split.
    data = f"synthetic:32x32x3:10:{5 * args.test_images}"
    workdir = Path(tempfile.mkdtemp(prefix="evaluate_once-"))
    config = TrainConfig(model=args.model, model_kwargs=kwargs, data=data, num_steps=1,
                         data_parallel=False)  # fmt: skip
    train_and_evaluate(config, workdir, quiet=True)
    run = open_run(workdir)
    assert run.dataset.split("test")[1].shape[0] == args.test_images
    variants = {"two programs (before)": evaluate_before, "one program (now)": evaluate_run}
    calls, first, reported = {}, {}, {}
    for name, fn in variants.items():
        t0 = time.perf_counter()
        reported[name] = _reported(fn(run))
        first[name] = time.perf_counter() - t0
        calls[name] = lambda fn=fn: fn(run)
        print(f"{name}: first evaluation {first[name]:.1f} s", flush=True)
    before, now = reported.values()
    same = before == now
    meter = OtherLoad()
    rounds = interleaved_rounds(calls, args.rounds, warmup=0, rotate=True)
    others = meter.cores()
    base = next(iter(rounds.values()))
    rows = []
    for name, ms in rounds.items():
        ci = median_interval(ms)
        ratio = None if ms is base else paired_ratio(base, ms)
        rows.append({
            "name": name, "first_s": first[name], "median_ms": float(np.median(ms)),
            "ci": None if ci is None else [ci.low, ci.high], "dispersion": dispersion(ms),
            "rounds_ms": ms, "before_over_this": None if ratio is None else list(ratio),
        })  # fmt: skip
    result = {"machine": finish_machine_info(machine), "model": args.model, "kwargs": kwargs,
              "test_images": args.test_images, "eval_batch_size": run.config.eval_batch_size,
              "other_cores": others, "same_results": same, "results": now,
              "rows": rows}  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        f"{args.model} {kwargs or ''}: {args.test_images} test images, eval_batch_size "
        f"{run.config.eval_batch_size}, other processes {others:.2f} cores; the same loss, "
        f"accuracy, top-5 accuracy and confusion matrix: {same}",
        "",
        "| evaluate | first evaluation s | evaluation ms median [95%] | IQR/median "
        "| before / this [95%] |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        ci = "" if r["ci"] is None else " [{:.0f}, {:.0f}]".format(*r["ci"])
        ratio = r["before_over_this"]
        ratio = "" if ratio is None else "{:.2f} [{:.2f}, {:.2f}]".format(*ratio)
        lines.append(
            f"| {r['name']} | {r['first_s']:.1f} | {r['median_ms']:.0f}{ci} "
            f"| {r['dispersion']:.1%} | {ratio} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
