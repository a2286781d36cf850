"""One conv's weight gradient by every variant layoutlab can run, beside PyTorch eager.

    python benchmarks/bf16_weight_gradient_variants.py 32,4,512,512,3,1            # bfloat16
    python benchmarks/bf16_weight_gradient_variants.py 32,8,256,256,3,1 float32

The conv is ``N,H,C,O,K,S``: batch, square input size, in and out channels, kernel size,
stride, with SAME padding, NHWC activations and HWIO kernels. Its weight gradient (the VJP of
``sum(conv(x, w) * g)`` with respect to ``w``, operands in the given dtype, float32 output as
``mixed_bf16`` asks) is jitted with the training step's XLA:CPU options for the algorithms
``onednn`` (as the shipped rule routes it), ``gemm_dw``, ``xla`` and ``onednn_xla_dw``, and
``onednn_bf16dw``: ``onednn`` set up with oneDNN's own bfloat16 kernel at every size (the
rule's float32 routing switched off while it traces). PyTorch times ``autograd.grad`` of one
kept forward graph in channels_last. Each variant's relative difference from XLA's result is
printed first; then 9 rounds of 3 calls per variant in turn, median and minimum ms and GF/s.
"""

from __future__ import annotations

import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch

from layoutlab.fast_defaults import cpu_fast_options
from layoutlab.nn.conv_algos import onednn
from layoutlab.nn.conv_algos.dispatch import conv2d


def main() -> None:
    n, h, c, o, k, s = (int(v) for v in sys.argv[1].split(","))
    dt = jnp.dtype(sys.argv[2]) if len(sys.argv) > 2 else jnp.dtype(jnp.bfloat16)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((n, h, h, c)), dt)
    w = jnp.asarray(rng.standard_normal((k, k, c, o)) * 0.05, dt)
    ho = (h + s - 1) // s
    g = jnp.asarray(rng.standard_normal((n, ho, ho, o)), jnp.float32)
    opts = cpu_fast_options("train", "sgd", batch=n)

    def make(algo):
        def f(w, x, g):
            y = conv2d(x, w, strides=s, padding="SAME", algorithm=algo,
                       preferred_element_type=jnp.float32)  # fmt: skip
            return jnp.sum(y * g)

        return jax.jit(jax.grad(f)).lower(w, x, g).compile(opts)

    cases = {a: make(a) for a in ["onednn", "gemm_dw", "xla", "onednn_xla_dw"]}
    saved = onednn.BF16_WEIGHT_GRADIENT_MIN_BATCH, onednn.slow_bf16_weight_gradient
    onednn.BF16_WEIGHT_GRADIENT_MIN_BATCH = 0
    onednn.slow_bf16_weight_gradient = lambda *a: False
    cases["onednn_bf16dw"] = make("onednn")
    onednn.BF16_WEIGHT_GRADIENT_MIN_BATCH, onednn.slow_bf16_weight_gradient = saved
    ref = np.asarray(cases["xla"](w, x, g), np.float64)
    for name, f in cases.items():
        d = np.asarray(f(w, x, g), np.float64)
        print(name, f"rel err vs xla {np.abs(d - ref).max() / np.abs(ref).max():.2e}")

    torch.set_num_threads(2)
    tdt = torch.bfloat16 if dt == jnp.bfloat16 else torch.float32

    def nchw(a, perm):
        t = torch.tensor(np.asarray(a, np.float32)).permute(*perm)
        return t.contiguous(memory_format=torch.channels_last).to(tdt)

    tx, tg = nchw(x, (0, 3, 1, 2)), nchw(g, (0, 3, 1, 2))
    tw = nchw(w, (3, 2, 0, 1)).requires_grad_()
    ty = torch.nn.functional.conv2d(tx, tw, stride=s, padding=k // 2)

    def torch_dw():
        torch.autograd.grad(ty, tw, tg, retain_graph=True)

    res = {name: [] for name in [*cases, "torch"]}
    for _ in range(9):
        for name in res:
            f = cases.get(name)
            fn = torch_dw if f is None else (lambda f=f: f(w, x, g).block_until_ready())
            t0 = time.perf_counter()
            for _ in range(3):
                fn()
            res[name].append((time.perf_counter() - t0) / 3 * 1e3)
    gflop = 2 * n * ho * ho * o * c * k * k / 1e9
    for name, v in res.items():
        med = statistics.median(v)
        print(f"{sys.argv[1]:>22} {dt.name:>8} {name:>15} median {med:8.2f} ms "
              f"{gflop / med * 1e3:7.0f} GF/s  min {min(v):.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
