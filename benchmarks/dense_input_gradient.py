"""A Dense layer's input gradient: JAX's own rule (``dy @ kernel.T``) against
``nn.linear.dense_matmul`` (``kernel . dy``, contracted over the kernel's minor axis).

    python benchmarks/dense_input_gradient.py --part layer
    python benchmarks/dense_input_gradient.py --part steps --batch 1
    python benchmarks/dense_input_gradient.py --part layer --backend gpu   # no options

``layer``: VGG-11's 25088x4096 classifier layer, the input gradient alone at 1, 8 and 32
rows, each form compiled with no options and with the training options' dots
(``INDIVIDUAL_DOT``), median of 8 calls.

``steps``: VGG-11-BN's whole training step (``interleaved_steps.workload``: 32x32x3, 10
classes, NHWC, fp32, SGD with momentum, the shipped conv table, the step's own compile
options) with every Dense on ``dense_matmul`` (the default) against ``jnp.matmul`` and
JAX's rule, interleaved by ``bench.sweep.run_group``; medians and the per-round ratio
``jax rule / dense_matmul``.
"""

from __future__ import annotations

import argparse
import json
import statistics

import jax
import jax.numpy as jnp
from interleaved_steps import median_cell, runner, workload
from jax import lax

from layoutlab.bench.jax_runner import JaxRunner
from layoutlab.bench.stats import paired_ratio
from layoutlab.bench.sweep import run_group
from layoutlab.bench.timing import timed
from layoutlab.fast_defaults import cpu_fast_options
from layoutlab.nn import linear

_DOTS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


def layer(backend: str) -> None:
    device = jax.devices(backend)[0]
    kernel = jax.device_put(jnp.full((25088, 4096), 1e-3, jnp.float32), device)
    forms = {
        "dy @ kernel.T": lambda dy, k: dy @ k.T,
        "kernel . dy": lambda dy, k: jnp.moveaxis(
            lax.dot_general(k, dy, (((1,), (1,)), ((), ()))), 0, -1
        ),
    }
    print("| rows | options | dy @ kernel.T ms | kernel . dy ms |")
    print("|---|---|---|---|")
    for rows in (1, 8, 32):
        dy = jax.device_put(jnp.ones((rows, 4096), jnp.float32), device)
        settings = (("none", {}), ("dots on YNNPACK", _DOTS))[: 2 if backend == "cpu" else 1]
        for name, options in settings:
            ms = []
            for form in forms.values():
                compiled = jax.jit(form).lower(dy, kernel).compile(options)

                def call(compiled=compiled, dy=dy):
                    jax.block_until_ready(compiled(dy, kernel))

                call()
                ms.append(1e3 * statistics.median(timed(call) for _ in range(8)))
            print(f"| {rows} | {name} | {ms[0]:.1f} | {ms[1]:.1f} |", flush=True)


class _JaxRule(JaxRunner):
    """The step with every Dense on ``jnp.matmul`` (JAX's own input gradient)."""

    def setup(self):
        saved = linear.dense_matmul
        linear.dense_matmul = lambda x, k, preferred=None: jnp.matmul(
            x, k, preferred_element_type=preferred
        )
        try:
            return super().setup()
        finally:
            linear.dense_matmul = saved


def steps(model: str, batch: int, budget: float, backend: str) -> None:
    w = workload(model, "train", batch)
    opts = cpu_fast_options("train", "pytorch", batch=batch) if backend == "cpu" else {}
    runners = [runner(w, "dense_matmul", opts, backend=backend),
               runner(w, "jax rule", opts, cls=_JaxRule, backend=backend)]  # fmt: skip
    rows = run_group(runners, repeats="auto", warmup=2, budget_s=budget)
    for r in rows:
        print(model, "train", batch, r["defaults"], r["status"], median_cell(r))
    if all(r["status"] == "ok" for r in rows):
        ours, jax_rule = (json.loads(r["round_ms"]) for r in rows)
        ci = paired_ratio(jax_rule, ours)
        print(f"jax rule / dense_matmul per round {ci.value:.2f} [{ci.low:.2f}, {ci.high:.2f}]")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", default="layer", choices=("layer", "steps"))
    p.add_argument("--model", default="vgg11_bn")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--time-budget", type=float, default=40.0)
    p.add_argument("--backend", default="cpu", choices=("cpu", "gpu"))
    args = p.parse_args(argv)
    if args.part == "layer":
        layer(args.backend)
    else:
        steps(args.model, args.batch, args.time_budget, args.backend)


if __name__ == "__main__":
    main()
