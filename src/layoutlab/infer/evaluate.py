"""``evaluate_run``: a run's test metrics, through the very eval code path training used.

Everything comes from ``layoutlab.train.evaluation.eval_sums`` with the eval step compiled
as the training loop compiles it (same program, batches, shardings, XLA options and eval
plan), so loss and accuracy equal the run's ``metrics.jsonl`` figures for the same
checkpoint bit for bit. An eval plan made for another eval batch (another device count
here, or a run from before evaluation ran equal batches) is made again for this one, as a
resume of the run would make it. The extras (top-5, confusion matrix, per-class accuracy)
are sums of the same step (``train.steps.make_eval_step``): each image goes through the
model once.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np

from layoutlab.infer.load import Run, class_names, open_run
from layoutlab.train.evaluation import eval_sums, jit_eval_step, record_metrics, run_eval_batch
from layoutlab.train.program import class_axis
from layoutlab.train.run_plan import replan_stale_eval_plan
from layoutlab.train.sharding import make_shardings
from layoutlab.train.spec import InputSpec
from layoutlab.train.steps import TOP_K, make_eval_step

__all__ = ["TOP_K", "evaluate_run", "on_current_eval_plan", "plot_confusion", "with_eval_batch"]


def evaluate_run(run: Run, batch_size: int | None = None) -> dict:
    """Test-split metrics of ``run`` (see the module docstring): a JSON-ready dict.
    ``batch_size``: the most test images per eval step in place of the run's
    ``eval_batch_size`` (None: the run's, whose figures are the run's own to the bit). At
    another one the counts (accuracy, confusion matrix, top-5) are the same and the loss
    differs only by float32 rounding: the losses are summed in another order, and the eval
    plan made for that batch may pick other conv algorithms."""
    if batch_size is not None:
        run = with_eval_batch(run, batch_size)
    shard = make_shardings(run.spec.data_parallel)
    run = on_current_eval_plan(run, shard.num_devices)
    # The run's own eval plan, jitted as the loop jits it: the metrics are the run's to the bit.
    eval_step = jit_eval_step(make_eval_step(run.eval_defs, class_axis(run.spec)), run.spec, shard)
    state = jax.device_put(run.state(), shard.replicated)
    sums = eval_sums(eval_step, state, run.dataset, run.spec, shard)
    return {
        "workdir": str(run.workdir),
        "step": run.step,
        "data": run.dataset.name,
        **record_metrics(sums),
        **_extras(sums),
        "class_names": class_names(run.dataset),
    }


def with_eval_batch(run: Run, batch_size: int) -> Run:
    """``run`` evaluating at most ``batch_size`` test images per step: its config's
    ``eval_batch_size``, which ``on_current_eval_plan`` then plans the eval step for."""
    if batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {batch_size}.")
    return dataclasses.replace(
        run, config=dataclasses.replace(run.config, eval_batch_size=batch_size)
    )


def on_current_eval_plan(run: Run, devices: int) -> Run:
    """``run`` with the eval plan its evaluation on ``devices`` runs: the stored one, unless it
    was made for another eval batch (``train.run_plan.current_eval_plan``), as a resume of
    the run would replan it."""
    batch = run_eval_batch(run.dataset, run.spec, devices)
    inputs = InputSpec.of(run.dataset, batch)
    # The restored model, not an abstract one built again: the plan needs only conv shapes.
    spec = replan_stale_eval_plan(run.spec, inputs, run.model(), batch)
    return run if spec is run.spec else dataclasses.replace(run, config=spec.config)


def _extras(sums: dict) -> dict:
    confusion = np.asarray(sums["confusion"], np.int64)
    support = confusion.sum(axis=1)
    per_class = np.diag(confusion) / np.maximum(support, 1)
    out = {
        "count": int(sums["count"]),
        "confusion": confusion.tolist(),  # rows: true class, columns: predicted class
        "per_class_accuracy": [
            float(a) if n else None for a, n in zip(per_class, support, strict=True)
        ],
    }
    if f"top{TOP_K}_correct" in sums:  # more classes than TOP_K
        out[f"test_top{TOP_K}_accuracy"] = int(sums[f"top{TOP_K}_correct"]) / out["count"]
    return out


def format_report(result: dict) -> str:
    """The printed report: metrics, confusion matrix, per-class accuracy."""
    names = result["class_names"]
    lines = [
        f"{result['workdir']} step {result['step']} on {result['data']} "
        f"({result['count']} test images)",
        f"test_loss {result['test_loss']:.6f}  test_accuracy {result['test_accuracy']:.6f}"
        + (
            f"  test_top{TOP_K}_accuracy {result[f'test_top{TOP_K}_accuracy']:.6f}"
            if f"test_top{TOP_K}_accuracy" in result
            else ""
        ),
        "confusion matrix (rows: true class, columns: predicted):",
    ]
    confusion = np.asarray(result["confusion"])
    width = max(len(str(confusion.max())), *(len(n) for n in names)) + 1
    label = max(len(n) for n in names)
    lines.append(" " * label + "".join(n.rjust(width) for n in names))
    for name, row in zip(names, confusion, strict=True):
        lines.append(name.rjust(label) + "".join(str(v).rjust(width) for v in row))
    lines.append("per-class accuracy:")
    for name, acc in zip(names, result["per_class_accuracy"], strict=True):
        lines.append(f"  {name}: " + ("no test images" if acc is None else f"{acc:.4f}"))
    return "\n".join(lines)


def plot_confusion(result: dict, path: str | Path) -> Path:
    """The confusion matrix as a PNG (row-normalized colors, counts written in the cells)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    confusion = np.asarray(result["confusion"])
    names = result["class_names"]
    rows = confusion / np.maximum(confusion.sum(axis=1, keepdims=True), 1)
    size = max(4.0, 0.45 * len(names) + 2)
    fig, ax = plt.subplots(figsize=(size, size))
    ax.imshow(rows, cmap="Blues", vmin=0, vmax=1)
    ticks = np.arange(len(names))
    ax.set_xticks(ticks, names, rotation=90 if len(names) > 12 else 0)
    ax.set_yticks(ticks, names)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    if len(names) <= 20:  # counts stay legible up to about this many classes
        for (i, j), v in np.ndenumerate(confusion):
            color = "white" if rows[i, j] > 0.5 else "black"
            ax.text(j, i, str(v), ha="center", va="center", fontsize=8, color=color)
    ax.set_title(f"{result['data']} step {result['step']}: accuracy {result['test_accuracy']:.4f}")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def evaluate_workdir(
    workdir,
    step: int | str | None = None,
    *,
    data: str | None = None,
    batch_size: int | None = None,
    weights: str = "raw",
) -> dict:
    """``evaluate_run`` of ``open_run(workdir, step, data=data, weights=weights)`` at
    ``batch_size``."""
    return evaluate_run(open_run(workdir, step, data=data, weights=weights), batch_size)
