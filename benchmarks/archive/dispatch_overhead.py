"""What calling a compiled step costs apart from its work, for batch-1 steps.

    python benchmarks/archive/dispatch_overhead.py

A ResNet-18 CIFAR state has about 160 arrays (parameters, batch statistics and, in
training, the optimizer's momenta). On trivial programs taking (and, for a training step,
returning) a tree of 160 small arrays, medians of 2000 blocking calls in microseconds:
``jax.jit`` called directly, the AOT-compiled executable, and ``bench.timing.JaxStep``
(the benchmark's call, with its recompilation guard) on the training-step shape.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp

from layoutlab.bench.timing import JaxStep


def _median_us(fn, n: int = 2000) -> float:
    for _ in range(50):
        fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(1e6 * (time.perf_counter() - t0))
    return statistics.median(times)


def main() -> None:
    x = jnp.ones((4,))
    tree = {f"p{i}": jnp.ones((8,)) for i in range(160)}
    forward = jax.jit(lambda t, x: x + 1)
    compiled = forward.lower(tree, x).compile()
    one = jax.jit(lambda x: x + 1)
    step = JaxStep(lambda t, x: (t, x + 1), (tree, x), carry=0)
    step.compile()
    jitted = step._jitted

    def raw_step():
        out = jitted(*step._args)
        jax.block_until_ready(out)
        step._args[0] = out[0]

    print(f"1 array in, 1 out (jit): {_median_us(lambda: one(x).block_until_ready()):.1f} us")
    print(f"160 in, 1 out (jit): {_median_us(lambda: forward(tree, x).block_until_ready()):.1f} us")
    aot = _median_us(lambda: compiled(tree, x).block_until_ready())
    print(f"160 in, 1 out (compiled): {aot:.1f} us")
    print(f"160 in, 160 out (jit): {_median_us(raw_step):.1f} us")
    print(f"160 in, 160 out (JaxStep): {_median_us(step):.1f} us")


if __name__ == "__main__":
    main()
