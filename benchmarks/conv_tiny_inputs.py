"""3x3 convs on inputs smaller than the kernel (2x2, 1x1): XLA's conv against im2col.

    python benchmarks/conv_tiny_inputs.py --cache /tmp/tiny.json
    python benchmarks/conv_tiny_inputs.py --cache /tmp/plain.json --batches 16 \
        --xla-option xla_cpu_experimental_ynn_fusion_type=   # plain XLA: convs on YNNPACK
    python benchmarks/conv_tiny_inputs.py --hlo --cache -    # the optimized conv
    python benchmarks/conv_autotune_table.py /tmp/tiny.json --out benchmarks/results/NAME

VGG-11 on 32x32 images ends at 2x2, and an ImageNet-stem ResNet on 32x32 at 1x1. Each
shape and batch goes through ``bench.tuning.autotune_conv`` with the candidates ``xla`` and
``im2col`` (checked against float64 NumPy, timed interleaved, with ``cpu_fast_options`` of
the objective unless ``--xla-option`` replaces them). ``--hlo`` prints the optimized HLO's
convolution of one such conv: XLA swaps its input and kernel when the kernel is larger.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from layoutlab.bench.tuning.convs import autotune_conv
from layoutlab.fast_defaults import cpu_fast_options
from layoutlab.nn.conv_algos.geometry import make_spec, resolve_geometry

# (input size, in channels, out channels, stride): VGG-11's 2x2 block, a ResNet's layer4
# conv at 1x1, a stride-2 conv into it, and a narrow one.
SHAPES = [(2, 512, 512, 1), (1, 512, 512, 1), (2, 256, 512, 2), (2, 64, 64, 1)]


def _options(items: list[str], mode: str) -> dict:
    if not items:
        return cpu_fast_options(mode)
    pairs = (item.split("=", 1) for item in items)
    return {k: v for k, v in pairs if v}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", required=True)
    p.add_argument("--batches", default="1,16,128")
    p.add_argument("--objectives", default="inference,train")
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--xla-option", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--hlo", action="store_true", help="print the optimized conv and stop")
    args = p.parse_args(argv)
    if args.hlo:
        x, w = jnp.ones((16, 2, 2, 512)), jnp.ones((3, 3, 512, 512))
        dims = ("NHWC", "HWIO", "NHWC")

        def conv(a, b):
            return jax.lax.conv_general_dilated(a, b, (1, 1), "SAME", dimension_numbers=dims)

        conv = jax.jit(conv)
        text = conv.lower(x, w).compile(compiler_options=_options(args.xla_option, "infer"))
        print(next(line.strip()[:220] for line in text.as_text().splitlines()
                   if "convolution(" in line))  # fmt: skip
        return
    for objective in args.objectives.split(","):
        options = _options(args.xla_option, "train" if objective == "train" else "infer")
        for size, cin, cout, stride in SHAPES:
            for batch in (int(b) for b in args.batches.split(",")):
                spec = make_spec((batch, size, size, cin), cout,
                                 resolve_geometry((size, size), 3, stride, "SAME"),
                                 "float32", "NHWC")  # fmt: skip
                r = autotune_conv(spec, algorithms=["xla", "im2col"], objective=objective,
                                  repeats=args.repeats, cache=args.cache,
                                  compiler_options=options)  # fmt: skip
                print(objective, spec.key(), r.choice, r.verdict, r.ratio, flush=True)


if __name__ == "__main__":
    main()
