"""``ConvTranspose`` as XLA's conv over the stride-dilated input against the one-dot form.

    python benchmarks/conv_transpose.py --part layers
    python benchmarks/conv_transpose.py --part steps --mode train --batch 32
    python benchmarks/conv_transpose.py --part layers --backend gpu   # no compile options

``layers``: U-Net's two 2x2 stride-2 transposed convs (width 16 at 32x32: 8x8x64 -> 32 and
16x16x32 -> 16 channels, NHWC, fp32) at batch 1, 8 and 32, in inference (the conv) and
training (the conv with both gradients, under a ``sum(sin(y))`` loss), each compiled with
the mode's ``cpu_fast_options`` and timed in interleaved rounds; the per-round ratio
``xla / matmul`` (above 1: the one-dot form is faster).

``steps``: the whole U-Net step (``interleaved_steps.workload``: 32x32, a label per pixel,
SGD with momentum, the shipped conv table, the step's compile options) with every
transposed conv on ``"matmul"`` (the default, ``"auto"``) against ``"xla"``, interleaved by
``bench.sweep.run_group``; prints each median and the per-round ratio ``xla / matmul``.
"""

from __future__ import annotations

import argparse
import json
import statistics

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from interleaved_steps import median_cell, runner, workload

from layoutlab import nn
from layoutlab.bench.jax_runner import JaxRunner
from layoutlab.bench.stats import paired_ratio
from layoutlab.bench.sweep import run_group
from layoutlab.bench.timing import timed
from layoutlab.fast_defaults import cpu_fast_options, cpu_kind
from layoutlab.nn import conv as conv_module

SHAPES = ((8, 64, 32), (16, 32, 16))  # (input size, in channels, out channels)


def _options(backend, mode, batch) -> dict:
    """The mode's CPU options on the CPU; none elsewhere (layoutlab sets none on a GPU)."""
    return cpu_fast_options(mode, "pytorch", batch=batch) if backend == "cpu" else {}


def _compiled(algorithm, mode, batch, size, cin, cout, backend):
    device = jax.devices(backend)[0]
    layer = nn.ConvTranspose(cin, cout, 2, strides=2, algorithm=algorithm, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(layer)
    params = jax.device_put(params, device)
    x = jax.device_put(np.random.default_rng(0).standard_normal((batch, size, size, cin))
                       .astype(np.float32), device)  # fmt: skip

    def forward(p, x):
        return jnp.sin(nnx.merge(graphdef, p)(x))

    def grads(p, x):
        return jax.grad(lambda p, x: jnp.sum(forward(p, x)), argnums=(0, 1))(p, x)

    fn = grads if mode == "train" else forward
    compiled = jax.jit(fn).lower(params, x).compile(_options(backend, mode, batch))
    return lambda: jax.block_until_ready(compiled(params, x))


def _cell(ci) -> str:
    return f"{ci.value:.2f} [{ci.low:.2f}, {ci.high:.2f}]"


def layers(rounds: int, backend: str) -> None:
    print("| mode | batch | shape (NHWC) | xla ms | matmul ms | xla / matmul [95%] |")
    print("|---|---|---|---|---|---|")
    for mode in ("infer", "train"):
        for batch in (1, 8, 32) + ((128,) if backend != "cpu" else ()):
            for size, cin, cout in SHAPES:
                runs = [_compiled(a, mode, batch, size, cin, cout, backend)
                        for a in ("xla", "matmul")]  # fmt: skip
                for run in runs:
                    run()
                times = [[], []]
                for _ in range(rounds):
                    for i, run in enumerate(runs):
                        times[i].append(statistics.median(timed(run) for _ in range(5)))
                ms = [1e3 * statistics.median(t) for t in times]
                print(f"| {mode} | {batch} | {size}x{size}:{cin}->{cout} | {ms[0]:.3f} | "
                      f"{ms[1]:.3f} | {_cell(paired_ratio(*times))} |", flush=True)  # fmt: skip


def _with_algorithm(algorithm):
    """A runner whose model's transposed convs are built with ``algorithm``."""

    class Runner(JaxRunner):
        def setup(self):
            saved = conv_module.ConvTranspose.__init__

            def init(layer, *args, **kwargs):
                saved(layer, *args, **{**kwargs, "algorithm": algorithm})

            conv_module.ConvTranspose.__init__ = init
            try:
                return super().setup()
            finally:
                conv_module.ConvTranspose.__init__ = saved

    return Runner


def steps(mode: str, batch: int, budget: float, backend: str) -> None:
    w = workload("unet", mode, batch)
    opts = _options(backend, mode, batch)
    runners = [runner(w, a, opts, cls=_with_algorithm(a), backend=backend)
               for a in ("matmul", "xla")]  # fmt: skip
    rows = run_group(runners, repeats="auto", warmup=2, budget_s=budget)
    where = cpu_kind() if backend == "cpu" else backend
    for r in rows:
        print(where, "unet", mode, batch, r["defaults"], r["status"], median_cell(r),
              r.get("error") or "")  # fmt: skip
    if all(r["status"] == "ok" for r in rows):
        matmul, xla = (json.loads(r["round_ms"]) for r in rows)
        print("xla / matmul per round", _cell(paired_ratio(xla, matmul)))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", default="layers", choices=("layers", "steps"))
    p.add_argument("--mode", default="train", choices=("train", "infer"))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=15, help="layers: interleaved rounds")
    p.add_argument("--time-budget", type=float, default=30.0, help="steps: seconds")
    p.add_argument("--backend", default="cpu", choices=("cpu", "gpu"))
    args = p.parse_args(argv)
    if args.part == "layers":
        layers(args.rounds, args.backend)
    else:
        steps(args.mode, args.batch, args.time_budget, args.backend)


if __name__ == "__main__":
    main()
