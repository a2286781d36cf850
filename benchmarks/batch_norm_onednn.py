"""BatchNorm(+ReLU) forward and backward in one jit: layoutlab's XLA BN (A) vs oneDNN's BN
primitive through XLA FFI (B), interleaved A/B pairs, plus a float64 NumPy check.

    python benchmarks/batch_norm_onednn.py [--set r50|r18b32|r18b128] [--dtype bf16|f32|both]
        [--budget SECONDS_PER_CASE] [--unfused]

Each jit returns (y, dx, dscale, dbias, mean, var) of jax.vjp at a fixed bf16/f32 cotangent,
so nothing is dead code and both write what a training step writes. A is compiled with the
XLA:CPU options a layoutlab SGD train step of that model gets (cpu_fast_options).
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from layoutlab.fast_defaults import fast_compile_options
from layoutlab.nn.norm import batch_norm_train
from layoutlab.nn.norm_onednn import batch_norm_train_nhwc, norm_info

EPS = 1e-5
# (N, H, W, C), relu, count in the network
SETS = {
    "r50": (
        16,
        16 * 112 * 112 * 64,
        [
            ((16, 112, 112, 64), True, 1),
            ((16, 56, 56, 64), True, 6),
            ((16, 56, 56, 256), False, 4),
            ((16, 56, 56, 128), True, 1),
            ((16, 28, 28, 128), True, 7),
            ((16, 28, 28, 512), False, 5),
            ((16, 28, 28, 256), True, 1),
            ((16, 14, 14, 256), True, 11),
            ((16, 14, 14, 1024), False, 7),
            ((16, 14, 14, 512), True, 1),
            ((16, 7, 7, 512), True, 5),
            ((16, 7, 7, 2048), False, 4),
        ],
    ),
    "r18b32": (
        32,
        32 * 32 * 32 * 64,
        [
            ((32, 32, 32, 64), True, 3),
            ((32, 32, 32, 64), False, 2),
            ((32, 16, 16, 128), True, 2),
            ((32, 16, 16, 128), False, 3),
            ((32, 8, 8, 256), True, 2),
            ((32, 8, 8, 256), False, 3),
            ((32, 4, 4, 512), True, 2),
            ((32, 4, 4, 512), False, 3),
        ],
    ),
}
SETS["r18b128"] = (
    128,
    128 * 32 * 32 * 64,
    [((128,) + s[1:], r, k) for s, r, k in SETS["r18b32"][2]],
)


def layoutlab_bn(x, scale, bias, relu):
    y, mean, var = batch_norm_train(x.astype(jnp.float32), scale, bias, (0, 1, 2), EPS)
    y = y.astype(x.dtype)
    return (jax.nn.relu(y) if relu else y), (mean, var)


def onednn_bn(x, scale, bias, relu):
    if UNFUSED and relu:  # oneDNN's BN, then XLA's ReLU
        y, mean, var = batch_norm_train_nhwc(x, scale, bias, EPS, False)
        return jax.nn.relu(y), (mean, var)
    y, mean, var = batch_norm_train_nhwc(x, scale, bias, EPS, relu)
    return y, (mean, var)


UNFUSED = False


def program(f, relu):
    def step(x, scale, bias, g):
        y, vjp, (mean, var) = jax.vjp(lambda *a: f(*a, relu), x, scale, bias, has_aux=True)
        dx, ds, db = vjp(g)
        return y, dx, ds, db, mean, var

    return step


def reference(x, scale, bias, g, relu):
    x, g = x.astype(np.float64), g.astype(np.float64)
    n = x.size // x.shape[-1]
    mean = x.mean((0, 1, 2))
    var = ((x - mean) ** 2).mean((0, 1, 2))
    rstd = 1 / np.sqrt(var + np.float64(np.float32(EPS)))
    xhat = (x - mean) * rstd
    pre = xhat * scale + bias
    y = np.maximum(pre, 0) if relu else pre
    dz = g * (pre > 0) if relu else g
    db = dz.sum((0, 1, 2))
    ds = (dz * xhat).sum((0, 1, 2))
    dx = scale * rstd / n * (n * dz - db - xhat * ds)
    # ReLU decisions within float32 rounding of the kink may flip (each flip moves dx at
    # that element by O(|g|), ds/db slightly): dx is compared away from the kink only.
    far = np.abs(pre) > 1e-5 if relu else np.ones(pre.shape, bool)
    return (y, dx, ds, db, mean, var), far


def errors(out, ref_far):
    """max |out - ref| / max |ref| per output (dx away from a ReLU kink)."""
    ref, far = ref_far
    res = []
    for k, (o, r) in enumerate(zip(out, ref, strict=True)):
        d = np.abs(np.asarray(o, np.float64) - r)
        if k == 1:
            d = d[far]
        res.append(float(d.max() / max(np.max(np.abs(r)), 1e-30)))
    return res


def timed(fn, args, inner):
    t = time.perf_counter()
    for _ in range(inner):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - t) / inner


def case(shape, relu, dtype, opts, budget):
    rng = np.random.default_rng(hash((shape, relu)) % 2**32)
    c = shape[-1]
    # A per-channel offset and spread, as conv outputs have.
    x32 = rng.standard_normal(shape) * rng.uniform(0.5, 2, c) + rng.uniform(-1, 1, c)
    x = jnp.asarray(x32, dtype)
    g = jnp.asarray(rng.standard_normal(shape), dtype)
    scale = jnp.asarray(rng.uniform(0.5, 1.5, c), jnp.float32)
    bias = jnp.asarray(rng.uniform(-0.5, 0.5, c), jnp.float32)
    args = (x, scale, bias, g)
    fa = jax.jit(program(layoutlab_bn, relu)).lower(*args).compile(opts)
    fb = jax.jit(program(onednn_bn, relu)).lower(*args).compile(opts)
    ref = reference(
        np.asarray(x.astype(jnp.float32)),
        np.asarray(scale, np.float64),
        np.asarray(bias, np.float64),
        np.asarray(g.astype(jnp.float32)),
        relu,
    )
    ea, eb = errors(fa(*args), ref), errors(fb(*args), ref)
    same = all(
        np.array_equal(np.asarray(u), np.asarray(v))
        for u, v in zip(fb(*args), fb(*args), strict=True)
    )
    t1 = timed(fa, args, 1)
    inner = max(1, int(0.02 / max(t1, 1e-6)))
    for _ in range(2):
        timed(fa, args, inner), timed(fb, args, inner)
    ta, tb, ratios = [], [], []
    t0 = time.perf_counter()
    i = 0
    while time.perf_counter() - t0 < budget or i < 10:
        if i % 2 == 0:
            a, b = timed(fa, args, inner), timed(fb, args, inner)
        else:
            b, a = timed(fb, args, inner), timed(fa, args, inner)
        ta.append(a), tb.append(b), ratios.append(a / b)
        i += 1
    ratios.sort()
    q = len(ratios) // 5
    return dict(
        a=statistics.median(ta) * 1e3,
        b=statistics.median(tb) * 1e3,
        amin=min(ta) * 1e3,
        bmin=min(tb) * 1e3,
        r=statistics.median(ratios),
        lo=ratios[q],
        hi=ratios[-1 - q],
        pairs=len(ratios),
        ea=ea,
        eb=eb,
        same=same,
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--set", default="r50", choices=sorted(SETS))
    p.add_argument("--dtype", default="both", choices=("bf16", "f32", "both"))
    p.add_argument("--budget", type=float, default=4.0)
    p.add_argument("--unfused", action="store_true", help="B: oneDNN BN, then XLA's ReLU")
    args = p.parse_args()
    global UNFUSED
    UNFUSED = args.unfused
    print("B:", "oneDNN BN then XLA ReLU" if UNFUSED else "oneDNN BN with fused ReLU")
    batch, act, shapes = SETS[args.set]
    opts = fast_compile_options("train", "cpu", "pytorch", batch, activation=act)
    print("compile options (A and B):", opts)
    dtypes = {"bf16": [jnp.bfloat16], "f32": [jnp.float32], "both": [jnp.bfloat16, jnp.float32]}[
        args.dtype
    ]
    for dtype in dtypes:
        name = jnp.dtype(dtype).name
        tot_a = tot_b = tot_amin = tot_bmin = 0.0
        for shape, relu, count in shapes:
            impl = norm_info(False, name, relu, shape, EPS)
            r = case(shape, relu, dtype, opts, args.budget)
            tot_a += count * r["a"]
            tot_b += count * r["b"]
            tot_amin += count * r["amin"]
            tot_bmin += count * r["bmin"]
            print(
                f"{name:8s} {'x'.join(map(str, shape)):16s} relu={int(relu)} x{count:<2d} "
                f"A {r['a']:8.3f} ms  B {r['b']:8.3f} ms  A/B {r['r']:.2f} "
                f"[{r['lo']:.2f}, {r['hi']:.2f}] n={r['pairs']:3d}  "
                f"min A {r['amin']:.3f} B {r['bmin']:.3f} ({r['amin'] / r['bmin']:.2f})  "
                f"impl={impl[0]}  "
                f"err(y,dx,ds,db,mean,var) A {' '.join(f'{e:.1e}' for e in r['ea'])} | "
                f"B {' '.join(f'{e:.1e}' for e in r['eb'])}  same_bits={r['same']}",
                flush=True,
            )
        print(
            f"{name} {args.set}: sum over the network's BNs (count x median): A {tot_a:.1f} ms,"
            f" B {tot_b:.1f} ms, A/B {tot_a / tot_b:.2f}; by minima A {tot_amin:.1f}"
            f" B {tot_bmin:.1f} A/B {tot_amin / tot_bmin:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
