"""``nn.pooling.max_pool`` forward + input gradient on oneDNN's primitive (``impl="auto"``)
against XLA's reduce-window and layoutlab's sliced backward (``impl="xla"``), interleaved.

    python benchmarks/ab_max_pool_onednn.py --rounds 15

Each variant is one jitted function returning the output and the input gradient of a fixed
cotangent; rounds alternate the two. Prints per shape and dtype the median milliseconds and
the median per-round ratio ``xla / onednn`` (above 1: oneDNN is faster). A shape whose
``max_pool`` does not run oneDNN (``nn.pooling.onednn_pool_reason``: VGG's 2x2/2 windows, which
do not overlap) prints the reason.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

from layoutlab.nn.pooling import max_pool, onednn_pool_reason

# (name, NHWC shape, window, stride, padding)
SHAPES = [
    ("resnet_stem", (16, 112, 112, 64), 3, 2, 1),
    ("vgg_block2", (16, 112, 112, 128), 2, 2, 0),
    ("vgg_block4", (16, 28, 28, 512), 2, 2, 0),
]


def _program(shape, k, s, p, dtype, impl):
    dims, strides = (1, k, k, 1), (1, s, s, 1)
    pads = ((0, 0), (p, p), (p, p), (0, 0))

    def step(x, g):
        y, vjp = jax.vjp(lambda v: max_pool(v, dims, strides, pads, impl), x)
        return y, vjp(g)[0]

    x = jax.random.normal(jax.random.key(0), shape, jnp.float32)
    x = jnp.maximum(x, 0).astype(dtype)  # ReLU'd, as a stem's input is: many ties at 0
    y_shape = jax.eval_shape(lambda v: max_pool(v, dims, strides, pads, "xla"), x).shape
    g = jax.random.normal(jax.random.key(1), y_shape, jnp.float32).astype(dtype)
    reason = onednn_pool_reason(jax.ShapeDtypeStruct(shape, dtype), dims, strides, pads)
    return jax.jit(step), (x, g), reason


def _time(fn, args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return (time.perf_counter() - start) * 1e3


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--shapes", default=",".join(n for n, *_ in SHAPES))
    args = p.parse_args(argv)
    wanted = args.shapes.split(",")
    for name, shape, k, s, pad in SHAPES:
        if name not in wanted:
            continue
        for dtype in args.dtypes.split(","):
            onednn, inputs, reason = _program(shape, k, s, pad, dtype, "auto")
            xla, _, _ = _program(shape, k, s, pad, dtype, "xla")
            if reason is not None:
                print(f"{name} {dtype}: oneDNN not used ({reason})")
                continue
            for fn in (onednn, xla):
                _time(fn, inputs)
                _time(fn, inputs)
            a, b = [], []
            for _ in range(args.rounds):
                a.append(_time(onednn, inputs))
                b.append(_time(xla, inputs))
            ratio = statistics.median(y / x for x, y in zip(a, b, strict=True))
            print(
                f"{name} {shape} {k}x{k}/s{s}/p{pad} {dtype}: onednn {statistics.median(a):.1f} "
                f"ms, xla {statistics.median(b):.1f} ms, xla/onednn per round {ratio:.2f}x"
            )


if __name__ == "__main__":
    main()
