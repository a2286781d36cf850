"""Does the input pipeline stall the step? Time one jitted train step fed three ways.

(a) ``resident``: batches already on the device, cycled (the input costs nothing);
(b) ``prefetch``: ``prefetch_to_device`` over ``train_batches`` (host gather, layout, cast,
    transfer in a background thread), the way training feeds the step;
(c) ``inline``: the same host batches built and ``device_put`` in the training loop.
Augmentation runs on device inside the step in all three. A ``prefetch/resident`` ratio
near 1 means the pipeline keeps up. Writes ``results/input_pipeline_<hostname>.json``.

    python benchmarks/input_pipeline.py [--batch 128] [--steps 40] [--layout NCHW]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from layoutlab.bench.machine import cpu_model
from layoutlab.data import augment, get_dataset, prefetch_to_device, train_batches
from layoutlab.layout import Layout, parse_layout


def init_params(key, channels: int, classes: int, width: int, layout: Layout):
    k1, k2 = jax.random.split(key)
    kernel_shape = (3, 3, channels, width) if layout.is_channels_last else (width, channels, 3, 3)
    return {
        "conv": jax.random.normal(k1, kernel_shape, jnp.float32) * jnp.float32(0.1),
        "dense": jax.random.normal(k2, (width, classes), jnp.float32) * jnp.float32(0.1),
    }


def make_step(layout: Layout, classes: int):
    """A small conv + dense SGD step with on-device augmentation: a few ms of work."""

    def loss_fn(params, images, labels):
        y = jax.lax.conv_general_dilated(
            images, params["conv"], (1, 1), "SAME", dimension_numbers=layout.dimension_numbers
        )
        y = jnp.mean(jax.nn.relu(y), axis=layout.spatial_axes)
        logits = y @ params["dense"]
        onehot = jax.nn.one_hot(labels, classes, dtype=logits.dtype)
        return -jnp.mean(jnp.sum(onehot * jax.nn.log_softmax(logits), axis=-1))

    @jax.jit
    def step(params, key, images, labels):
        key, sub = jax.random.split(key)
        images = augment(sub, images, layout)
        grads = jax.grad(loss_fn)(params, images, labels)
        params = jax.tree.map(lambda p, g: p - jnp.float32(0.01) * g, params, grads)
        return params, key

    return step


def time_steps(step, params, key, batches, steps: int) -> float:
    """Mean seconds per step over ``steps`` steps, after one warm-up step."""
    it = iter(batches)
    params, key = step(params, key, *next(it))
    jax.block_until_ready(params)
    start = time.perf_counter()
    for _ in range(steps):
        params, key = step(params, key, *next(it))
    jax.block_until_ready(params)
    return (time.perf_counter() - start) / steps


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="synthetic:32x32x3:10:1280", metavar="SOURCE")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layout", default="NHWC")
    parser.add_argument("--width", type=int, default=8, help="conv output channels")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)

    layout = parse_layout(args.layout, rank=4)
    ds = get_dataset(args.data, seed=0)
    step = make_step(layout, ds.num_classes)
    params = init_params(jax.random.key(0), ds.num_channels, ds.num_classes, args.width, layout)
    key = jax.random.key(1)
    total = args.steps + 1

    def host(start: int):
        return train_batches(ds, args.batch, layout=layout, start_step=start, num_steps=total)

    resident = [jax.device_put(b) for b in host(0)]
    feeds = {
        "resident": lambda: iter(resident),
        "prefetch": lambda: prefetch_to_device(host(0), size=2),
        "inline": lambda: (jax.device_put(b) for b in host(0)),
    }
    times: dict[str, list[float]] = {name: [] for name in feeds}
    for _ in range(args.repeats):  # interleaved, so machine noise hits all feeds alike
        for name, feed in feeds.items():
            times[name].append(time_steps(step, params, key, feed(), args.steps))
    step_ms = {name: 1e3 * statistics.median(ts) for name, ts in times.items()}

    device = jax.devices()[0]
    result = {
        "benchmark": "input_pipeline",
        "machine": {
            "hostname": socket.gethostname(),
            "cpu": cpu_model(),
            "cpu_count": os.cpu_count(),
            "backend": jax.default_backend(),
            "device": device.device_kind,
            "jax": jax.__version__,
            "python": platform.python_version(),
            "numpy": np.__version__,
        },
        "config": {
            "data": args.data,
            "batch": args.batch,
            "steps": args.steps,
            "repeats": args.repeats,
            "layout": layout.value,
            "conv_width": args.width,
            "image_shape": list(ds.image_shape),
        },
        "step_ms_median": {k: round(v, 3) for k, v in step_ms.items()},
        "step_ms_all": {k: [round(1e3 * t, 3) for t in ts] for k, ts in times.items()},
        "ratio_prefetch_vs_resident": round(step_ms["prefetch"] / step_ms["resident"], 3),
        "ratio_inline_vs_resident": round(step_ms["inline"] / step_ms["resident"], 3),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"input_pipeline_{socket.gethostname()}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
