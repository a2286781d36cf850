"""Does a batch-1 conv get anything from a second core? XLA:CPU against PyTorch, one shape.

    python benchmarks/second_core_probe.py [--size 32] [--channels 64] [--repeats 200]

Runs the same measurements in two child processes, one confined to one core
(``os.sched_setaffinity`` before JAX or PyTorch start) and one with every core, and prints
each one's median ms and the speed-up from the extra cores:

- ``xla conv``: one batch-1 3x3 stride-1 NHWC conv, XLA's own (Eigen), with the dot-only
  YNNPACK option ``layoutlab`` compiles inference with;
- ``ynnpack conv``: the same conv handed to YNNPACK (``INDIVIDUAL_CONVOLUTION``);
- ``xla 2 / 4 independent convs``: that many convs of the same input in one program, which
  XLA:CPU's executor may run side by side;
- ``xla batch 8``: the same conv at batch 8, where Eigen splits the work;
- ``torch conv``: PyTorch's ``conv2d`` in channels_last on as many threads as cores (when
  PyTorch is installed).

The figures behind ``every_batch_avx512_cpu.md`` (round 8) and
``core_scaling_resnet18_cifar_avx512_cpu.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_Y = "LIBRARY_FUSION_TYPE_"
_KEY = "xla_cpu_experimental_ynn_fusion_type"


def _median_ms(fn, repeats: int) -> float:
    from layoutlab.bench.timing import summarize, timed  # imports jax: only in the children

    for _ in range(10):
        fn()
    return summarize([timed(fn) for _ in range(repeats)]).median_ms


def _child(size: int, channels: int, repeats: int) -> dict:
    import jax
    import numpy as np
    from jax import lax

    def conv(x, w):
        dims = ("NHWC", "HWIO", "NHWC")
        return lax.conv_general_dilated(x, w, (1, 1), [(1, 1)] * 2, dimension_numbers=dims)

    rng = np.random.default_rng(0)
    w = rng.random((3, 3, channels, channels), np.float32)
    out = {}

    def time_xla(name, fn, batch, library):
        x = rng.random((batch, size, size, channels), np.float32)
        compiled = jax.jit(fn).lower(x, w).compile(compiler_options={_KEY: library})
        out[name] = _median_ms(lambda: jax.block_until_ready(compiled(x, w)), repeats)

    dot, dot_conv = f"{_Y}INDIVIDUAL_DOT", f"{_Y}INDIVIDUAL_DOT,{_Y}INDIVIDUAL_CONVOLUTION"
    time_xla("xla conv", conv, 1, dot)
    time_xla("ynnpack conv", conv, 1, dot_conv)
    for k in (2, 4):
        time_xla(f"xla {k} independent convs",
                 lambda x, w, k=k: [conv(x * (i + 1), w) for i in range(k)], 1, dot)  # fmt: skip
    time_xla("xla batch 8", conv, 8, dot)
    try:
        import torch
    except ImportError:
        return out
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    x = torch.from_numpy(rng.random((1, channels, size, size), np.float32))
    x = x.contiguous(memory_format=torch.channels_last)
    wt = torch.from_numpy(w.transpose(3, 2, 0, 1).copy()).contiguous(
        memory_format=torch.channels_last
    )
    with torch.inference_mode():
        conv2d = torch.nn.functional.conv2d
        out["torch conv"] = _median_ms(lambda: conv2d(x, wt, padding=1), repeats)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--child-cores", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child_cores is not None:
        cores = sorted(os.sched_getaffinity(0))[: args.child_cores]
        os.sched_setaffinity(0, cores)  # before JAX and PyTorch size their thread pools
        print(json.dumps(_child(args.size, args.channels, args.repeats)))
        return
    all_cores = len(os.sched_getaffinity(0))
    results = {}
    for cores in (1, all_cores):
        sizes = ["--size", str(args.size), "--channels", str(args.channels)]
        cmd = [sys.executable, __file__, *sizes, "--repeats", str(args.repeats)]
        cmd += ["--child-cores", str(cores)]
        lines = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results[cores] = json.loads(lines.strip().splitlines()[-1])
    print(f"batch-1 {args.size}x{args.size}x{args.channels} 3x3 conv, median ms")
    print(f"{'':28s} {'1 core':>8s} {f'{all_cores} cores':>8s} {'speed-up':>8s}")
    for name, one in results[1].items():
        many = results[all_cores][name]
        print(f"{name:28s} {one:8.3f} {many:8.3f} {one / many:7.2f}x")


if __name__ == "__main__":
    main()
