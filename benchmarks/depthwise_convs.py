"""MobileNetV2's depthwise convs one by one: XLA's grouped conv against ``depthwise``.

    python benchmarks/depthwise_convs.py --batch 8 --mode train

Takes every depthwise conv shape of MobileNetV2 (CIFAR 32x32, NHWC, fp32) at ``--batch``
and runs the product's own conv autotuner on it restricted to ``xla`` and ``depthwise``
(``bench.tuning.autotune_convs``: each checked against the float64 NumPy reference, then
timed in interleaved rounds, compiled with the mode's CPU options) in a throwaway cache.
Prints one row per shape: each algorithm's median ms (forward, or forward and backward for
``train``), the per-round ratio ``xla / depthwise`` with its 95% interval, and the choice.
The whole step with and without the table's rule: ``ab_table_rules.py --model
mobilenet_v2 --drop depthwise``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from layoutlab import models
from layoutlab.bench.tuning import autotune_convs
from layoutlab.fast_defaults import cpu_fast_options
from layoutlab.nn.conv_config import conv_specs


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--mode", default="train", choices=("train", "infer"))
    p.add_argument("--repeats", type=int, default=12)
    args = p.parse_args(argv)
    model = models.create("mobilenet_v2", num_classes=10, layout="NHWC", rngs=nnx.Rngs(0))
    images = jax.ShapeDtypeStruct((args.batch, 32, 32, 3), jnp.float32)
    specs = [s for s in conv_specs(model, images).values() if s.geometry.groups > 1]
    objective = "train" if args.mode == "train" else "inference"
    results = autotune_convs(
        specs,
        algorithms=["xla", "depthwise"],
        objective=objective,
        repeats=args.repeats,
        cache=Path(tempfile.mkdtemp()) / "cache.json",
        compiler_options=cpu_fast_options(args.mode, "pytorch", batch=args.batch),
    )
    print(f"| shape | xla ms | depthwise ms | xla / depthwise [95%] | choice |  ({args.mode})")
    print("|---|---|---|---|---|")
    for r in results:
        ms = {name: statistics.median(t) for name, t in r.rounds_ms.items()}
        ratio = f"{r.ratio[0]:.2f} [{r.ratio[1]:.2f}, {r.ratio[2]:.2f}]" if r.ratio else ""
        print(f"| {r.spec_key} | {ms.get('xla', float('nan')):.3f} | "
              f"{ms.get('depthwise', float('nan')):.3f} | {ratio} | {r.choice} |")  # fmt: skip


if __name__ == "__main__":
    main()
