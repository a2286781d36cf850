"""Each 3x3 conv of ResNet-18 CIFAR, XLA:CPU against PyTorch eager, one conv at a time.

    python benchmarks/conv_vs_torch_per_shape.py --batch 8 --mode infer
    python benchmarks/conv_vs_torch_per_shape.py --batch 8 --mode train --out DIR

Where a whole step trails PyTorch, this says which convs carry the gap. Per shape (NHWC
activations, HWIO kernels, float32, no bias): XLA's conv compiled with the step's XLA:CPU
options (``cpu_fast_options``: convs on Eigen), the same conv with YNNPACK's conv fusion
added (``INDIVIDUAL_CONVOLUTION``), and ``torch.nn.functional.conv2d`` on channels_last
tensors (oneDNN). ``infer`` times the forward; ``train`` the forward with the input and
weight gradients (``jax.vjp``; ``torch.autograd.grad``). Every case is compiled and warmed
up first, then the cases run round by round (A B C A B C ...), a block of calls each, so
they share the machine's load; a row gives each median and the per-round ratio
``torch / xla`` with its 95% interval (below 1: PyTorch faster). One-conv programs carry a
call overhead that a whole step shares between its convs, so read ratios, not sums.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import jax
import numpy as np
import torch
from jax import lax

from layoutlab.bench.machine import finish_machine_info, machine_info
from layoutlab.bench.stats import paired_ratio
from layoutlab.bench.timing import block_rounds
from layoutlab.fast_defaults import cpu_fast_options

# (in channels, out channels, input size, stride): ResNet-18 CIFAR's 3x3 convs.
SHAPES = [(3, 64, 32, 1), (64, 64, 32, 1), (64, 128, 32, 2), (128, 128, 16, 1),
          (128, 256, 16, 2), (256, 256, 8, 1), (256, 512, 8, 2), (512, 512, 4, 1)]  # fmt: skip
_KEY = "xla_cpu_experimental_ynn_fusion_type"


def _jax_case(mode: str, stride: int, options: dict, x, w):
    def conv(a, b):
        return lax.conv_general_dilated(
            a, b, (stride, stride), ((1, 1), (1, 1)), dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    def train(a, b):
        y, vjp = jax.vjp(conv, a, b)
        return vjp(y)  # the output as its own cotangent: a full-size gradient, no extra input

    fn = conv if mode == "infer" else train
    compiled = jax.jit(fn).lower(x, w).compile(compiler_options=options)
    return lambda: jax.block_until_ready(compiled(x, w))


def _torch_case(mode: str, stride: int, x, w):
    def run():
        if mode == "infer":
            with torch.no_grad():
                return torch.nn.functional.conv2d(x, w, stride=stride, padding=1)
        y = torch.nn.functional.conv2d(x, w, stride=stride, padding=1)
        return torch.autograd.grad(y, (x, w), y.detach())

    return run


def _cases(mode: str, batch: int, shape: tuple[int, int, int, int]) -> dict:
    c_in, c_out, size, stride = shape
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, size, size, c_in), dtype=np.float32)
    w = (rng.standard_normal((3, 3, c_in, c_out), dtype=np.float32) / np.sqrt(9 * c_in)).astype(
        np.float32
    )
    options = cpu_fast_options("train" if mode == "train" else "infer", "pytorch", batch=batch)
    with_conv = {_KEY: options[_KEY] + ",LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION"}
    tx = torch.from_numpy(x).permute(0, 3, 1, 2).requires_grad_(mode == "train")
    tw = torch.from_numpy(np.ascontiguousarray(w.transpose(3, 2, 0, 1)))
    tw = tw.contiguous(memory_format=torch.channels_last).requires_grad_(mode == "train")
    return {
        "xla": _jax_case(mode, stride, options, x, w),
        "xla+ynn_conv": _jax_case(mode, stride, with_conv, x, w),
        "torch": _torch_case(mode, stride, tx, tw),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--mode", default="infer", choices=("infer", "train"))
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--block", type=int, default=5, help="timed calls per case per round")
    p.add_argument(
        "--alone",
        action="store_true",
        help="time each case in rounds of its own, one case after the other, not interleaved "
        "(a conv right after PyTorch's ran 19-40%% slower on a 2-core Zen 4); the ratio is "
        "then of the medians, no interval",
    )
    p.add_argument("--out", help="folder for conv_vs_torch_<mode>_b<batch>[_alone].json")
    args = p.parse_args(argv)
    machine = machine_info("cpu")
    rows = []
    head = "| xla ms | xla+ynn_conv ms | torch ms | torch/xla [95%] |"
    print(f"| shape (NHWC, n{args.batch}) {head}")
    print("|---|---|---|---|---|")
    for shape in SHAPES:
        cases = _cases(args.mode, args.batch, shape)
        if args.alone:
            times = {
                k: block_rounds({k: run}, args.rounds, args.block, warmup=3)[k]
                for k, run in cases.items()
            }
        else:
            times = block_rounds(cases, args.rounds, args.block, warmup=3)
        med = {name: statistics.median(t) for name, t in times.items()}
        if args.alone:  # not paired: the two ran in different rounds
            ratio = f"{med['torch'] / med['xla']:.2f} (of medians)"
        else:
            r = paired_ratio(times["torch"], times["xla"])  # None: too few rounds
            ratio = f"{r.value:.2f} [{r.low:.2f}, {r.high:.2f}]" if r else "-"
        c_in, c_out, size, stride = shape
        name = f"{size}x{size}:{c_in}->{c_out}:s{stride}"
        print(f"| {name} | {med['xla']:.2f} | {med['xla+ynn_conv']:.2f} | {med['torch']:.2f} | "
              f"{ratio} |", flush=True)  # fmt: skip
        rows.append({"shape": name, "mode": args.mode, "batch": args.batch, "round_ms": times})
    if args.out:
        suffix = "_alone" if args.alone else ""
        path = Path(args.out) / f"conv_vs_torch_{args.mode}_b{args.batch}{suffix}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        result = {"machine": finish_machine_info(machine), "rows": rows}
        path.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
