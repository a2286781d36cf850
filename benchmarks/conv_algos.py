"""Per-algorithm conv microbenchmarks on the conv shapes of ResNet-18, beside PyTorch.

    python benchmarks/conv_algos.py [--parts cifar,imagenet,flags,model] [--repeats 3]
        [--dtypes float32,bfloat16] [--layouts NHWC,NCHW] [--no-torch]
        [--note "..."] [--out benchmarks/results]

Parts:
- ``cifar``: the distinct convs of ResNet-18 with the CIFAR stem, 32x32, batch 32;
- ``imagenet``: the stem and stage-1/2 convs with the ImageNet stem, 224x224, batch 8;
- ``flags``: a few XLA:CPU compile options on two convs (per-compile ``compiler_options``);
- ``dtypes``: a bf16 GEMM and conv (float32 accumulation) against float32;
- ``model``: a whole ResNet-18 (CIFAR stem, batch 32) forward and forward+backward with
  native XLA convs, with the autotuned per-shape choices (``algorithm="auto"``), and PyTorch.

For every shape x dtype x layout, each algorithm that supports the shape is timed for the
forward and for forward + backward (``jax.vjp``: output, input and weight gradients),
with PyTorch's ``conv2d`` (oneDNN; ``channels_last`` memory for NHWC) on the same shape in
the same rounds: candidates are interleaved (A B C A B C ...) and medians kept, so ratios
are taken under the same machine load. Numerics (max |error| / max |reference| against a
float64 NumPy reference, forward and both gradients) are checked once per shape and dtype
in NHWC (the math is the same in NCHW) with ``conv_tolerance``.

Writes ``<out>/conv_algos_<tag>.json`` (machine, versions, every row) and
``<out>/conv_algos_<tag>.md`` (tables); ``--tag`` defaults to ``cpu``.

Run time on the shared 2-core VM: the full default run took about 23 minutes (most of it
compiles); ``--quick`` (CIFAR shapes, float32, both layouts, the flags part) is the
few-minute version, and ``--parts``/``--dtypes``/``--layouts`` pick pieces.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from layoutlab.bench.machine import machine_info
from layoutlab.bench.report import markdown_grid
from layoutlab.bench.timing import interleaved_ms
from layoutlab.bench.tuning.conv_candidates import candidate_fns
from layoutlab.bench.tuning.conv_reference import candidate_errors, reference_conv, spec_inputs
from layoutlab.bench.tuning.convs import candidates_for
from layoutlab.nn import conv_algos as ca

# (in_channels, out_channels, kernel, stride, input size) of ResNet-18's distinct convs
CIFAR = [
    (3, 64, 3, 1, 32),
    (64, 64, 3, 1, 32),
    (64, 128, 3, 2, 32),
    (64, 128, 1, 2, 32),
    (128, 128, 3, 1, 16),
    (128, 256, 3, 2, 16),
    (128, 256, 1, 2, 16),
    (256, 256, 3, 1, 8),
    (256, 512, 3, 2, 8),
    (256, 512, 1, 2, 8),
    (512, 512, 3, 1, 4),
]
# The ImageNet stem and stage-1/2 shapes (later stages resemble the CIFAR ones at a
# smaller batch), to keep the run short on a 2-core machine.
IMAGENET = [
    (3, 64, 7, 2, 224),
    (64, 64, 3, 1, 56),
    (64, 128, 3, 2, 56),
    (64, 128, 1, 2, 56),
    (128, 128, 3, 1, 28),
]
BATCH = {"cifar": 32, "imagenet": 8}


def make_spec(cin, cout, k, s, size, batch, dtype, layout):
    xs = (batch, size, size, cin) if layout == "NHWC" else (batch, cin, size, size)
    ws = (k, k, cin, cout) if layout == "NHWC" else (cout, cin, k, k)
    return ca.conv_spec(xs, ws, strides=s, padding=(k - 1) // 2, layout=layout, dtype=dtype)


def shape_label(cin, cout, k, s, size, batch):
    return f"{batch}x{size}x{size} {cin}->{cout} k{k} s{s}"


# ---------------------------------------------------------------- JAX and torch callables


def jax_fns(spec, name, inputs, options=None):
    """Compiled ``fwd()`` and ``train()`` closures (inputs bound), and compile seconds (0
    when the autotuner's compile cache already held them). ``name`` may carry a flag set,
    ``"xla@ynn_off"``: that algorithm under those options."""
    if "@" in name:
        name, flags = name.split("@")
        options = FLAG_SETS[flags]
    dtype = jnp.dtype(spec.dtype)
    x, w, dy = (jnp.asarray(a, dtype) for a in inputs)
    t0 = time.perf_counter()
    fwd_c, train_c = candidate_fns(spec, name, compiler_options=options)
    compile_s = time.perf_counter() - t0
    return (
        lambda: jax.block_until_ready(fwd_c(x, w)),
        lambda: jax.block_until_ready(train_c(x, w, dy)),
        compile_s,
    )


def torch_fns(spec, inputs):
    import torch

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[spec.dtype]
    fmt = torch.channels_last if spec.layout == "NHWC" else torch.contiguous_format
    x, w, dy = inputs
    if spec.layout == "NHWC":  # torch tensors are NCHW logically; memory format does the rest
        x, dy, w = (
            np.transpose(x, (0, 3, 1, 2)),
            np.transpose(dy, (0, 3, 1, 2)),
            np.transpose(w, (3, 2, 0, 1)),
        )
    tx = torch.from_numpy(np.ascontiguousarray(x)).to(dtype).contiguous(memory_format=fmt)
    tw = torch.from_numpy(np.ascontiguousarray(w)).to(dtype).contiguous(memory_format=fmt)
    tdy = torch.from_numpy(np.ascontiguousarray(dy)).to(dtype).contiguous(memory_format=fmt)
    tx.requires_grad_(True)
    tw.requires_grad_(True)
    (pl, _), (ql, _) = spec.geometry.padding
    stride = spec.geometry.strides

    def fwd():
        with torch.no_grad():
            torch.nn.functional.conv2d(tx, tw, stride=stride, padding=(pl, ql))

    def train():
        tx.grad = tw.grad = None
        y = torch.nn.functional.conv2d(tx, tw, stride=stride, padding=(pl, ql))
        y.backward(tdy)

    return fwd, train


# ---------------------------------------------------------------- parts


def _time_config(spec, names, inputs, args, use_torch, fns_by_name=None):
    """Interleaved medians for ``names`` (+ torch) on ``spec``; returns (ms, compile_s)."""
    fns, compile_s = {}, {}
    for n in names:
        f, t, c = (
            fns_by_name[n]
            if fns_by_name and n in fns_by_name
            else jax_fns(spec, n, inputs, FLAG_SETS[args.flags])
        )
        fns[("fwd", n)], fns[("train", n)], compile_s[n] = f, t, c
    if use_torch:
        fns[("fwd", "torch")], fns[("train", "torch")] = torch_fns(spec, inputs)
    return interleaved_ms(fns, args.repeats), compile_s


def run_shapes(part, shapes, args, use_torch):
    """NHWC: every candidate is compiled and checked against float64, the passing ones timed.
    NCHW: the same math, so only ``xla`` and the ``--nchw-top`` fastest NHWC candidates."""
    rows = []
    batch = BATCH[part]
    for shape in shapes:
        label = shape_label(*shape, batch)
        refs = None
        for dtype in args.dtypes:
            nhwc_rank = []
            for layout in args.layouts:
                spec = make_spec(*shape, batch, dtype, layout)
                inputs = spec_inputs(spec, seed=0)
                numerics, prepared = {}, {}
                if layout == "NHWC" or "NHWC" not in args.layouts:
                    if refs is None or refs[0] != layout:
                        refs = (layout, reference_conv(*inputs, spec))
                    names = candidates_for(spec) + [f"xla@{f}" for f in args.xla_variants]
                    for n in names:
                        prepared[n] = jax_fns(spec, n, inputs, FLAG_SETS[args.flags])
                        outs = prepared[n][1]()
                        numerics[n] = candidate_errors(spec, outs, refs[1])
                    timed = [n for n in names if numerics[n][2]]
                else:
                    extra = [f"xla@{f}" for f in args.xla_variants]
                    rest = [n for n in nhwc_rank if n != "xla" and n not in extra]
                    timed = ["xla", *extra, *rest[: args.nchw_top]]
                ms, compile_s = _time_config(spec, timed, inputs, args, use_torch, prepared)
                if layout == "NHWC":
                    nhwc_rank = sorted(timed, key=lambda n: ms[("train", n)])
                for n in [*numerics, *[t for t in timed if t not in numerics]]:
                    err, _, passed = numerics.get(n, (None, None, None))
                    rows.append(
                        {
                            "part": part,
                            "shape": label,
                            "dtype": dtype,
                            "layout": layout,
                            "algorithm": n,
                            "forward_ms": ms.get(("fwd", n)),
                            "train_ms": ms.get(("train", n)),
                            "compile_s": compile_s.get(n),
                            "errors": err,
                            "passed": passed,
                        }
                    )
                if use_torch:
                    rows.append(
                        {
                            "part": part,
                            "shape": label,
                            "dtype": dtype,
                            "layout": layout,
                            "algorithm": "torch",
                            "forward_ms": ms[("fwd", "torch")],
                            "train_ms": ms[("train", "torch")],
                            "compile_s": None,
                            "errors": None,
                            "passed": None,
                        }
                    )
                best = min(timed, key=lambda n: ms[("train", n)])
                print(
                    f"[{part}] {label} {dtype} {layout}: xla {ms[('train', 'xla')]:.1f} ms, "
                    f"best {best} {ms[('train', best)]:.1f} ms"
                    + (f", torch {ms[('train', 'torch')]:.1f} ms" if use_torch else ""),
                    flush=True,
                )
    return rows


FLAG_SETS = {
    "default": None,
    "fast_math": {"xla_cpu_enable_fast_math": True},
    "no_eigen_threads": {"xla_cpu_multi_thread_eigen": False},
    # XLA:CPU (jaxlib 0.10) hands convs and dots to YNNPACK; an empty list turns that off
    # (Eigen kernels), INDIVIDUAL_DOT keeps it for dots only.
    "ynn_off": {"xla_cpu_experimental_ynn_fusion_type": ""},
    "ynn_dots_only": {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"},
}


def run_flags(args):
    rows = []
    for shape, part in (((64, 64, 3, 1, 32), "cifar"), ((256, 256, 3, 1, 8), "cifar")):
        spec = make_spec(*shape, BATCH[part], "float32", "NHWC")
        inputs = spec_inputs(spec)
        fns, errors = {}, {}
        for alg in ("xla", "gemm_dw"):
            for label, opts in FLAG_SETS.items():
                try:
                    f, t, _ = jax_fns(spec, alg, inputs, opts)
                except Exception as err:  # a flag this jaxlib rejects is reported
                    errors[(alg, label)] = f"{type(err).__name__}: {str(err)[:200]}"
                    continue
                fns[("fwd", alg, label)], fns[("train", alg, label)] = f, t
        ms = interleaved_ms(fns, args.repeats)
        for (mode, alg, label), v in ms.items():
            rows.append(
                {
                    "shape": shape_label(*shape, BATCH[part]),
                    "algorithm": alg,
                    "flags": label,
                    "options": FLAG_SETS[label],
                    "mode": mode,
                    "ms": v,
                }
            )
        for (alg, label), e in errors.items():
            rows.append(
                {
                    "shape": shape_label(*shape, BATCH[part]),
                    "algorithm": alg,
                    "flags": label,
                    "options": FLAG_SETS[label],
                    "error": e,
                }
            )
        print(
            f"[flags] {shape}: "
            + ", ".join(f"{k[1]}/{k[2]}/{k[0]} {v:.1f}" for k, v in ms.items()),
            flush=True,
        )
    return rows


def run_dtypes(args):
    """bf16 operands with float32 accumulation vs float32: one GEMM and one native conv."""
    from jax import lax

    rng = np.random.default_rng(0)
    fns = {}
    for dt in (jnp.float32, jnp.bfloat16):
        name = jnp.dtype(dt).name
        a = jnp.asarray(rng.standard_normal((8192, 576)), dt)
        b = jnp.asarray(rng.standard_normal((576, 128)), dt)
        dot = jax.jit(
            lambda a, b: lax.dot_general(
                a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
            )
        )
        x = jnp.asarray(rng.standard_normal((32, 32, 32, 64)), dt)
        w = jnp.asarray(rng.standard_normal((3, 3, 64, 64)), dt)
        conv = jax.jit(
            lambda x, w: lax.conv_general_dilated(
                x,
                w,
                (1, 1),
                ((1, 1), (1, 1)),
                dimension_numbers=("NHWC", "HWIO", "NHWC"),
                preferred_element_type=jnp.float32,
            )
        )
        hlo = conv.lower(x, w).compile().as_text()
        fns[("dot 8192x576 @ 576x128", name)] = lambda f=dot, a=a, b=b: f(a, b).block_until_ready()
        fns[("conv 32x32x32 64->64 k3", name)] = lambda f=conv, x=x, w=w: f(
            x, w
        ).block_until_ready()
        print(f"[dtypes] {name} conv HLO converts operands: {' convert(' in hlo}", flush=True)
    ms = interleaved_ms(fns, max(args.repeats, 5))
    rows = [{"op": op, "dtype": dt, "ms": v} for (op, dt), v in ms.items()]
    print("[dtypes] " + ", ".join(f"{r['op']} {r['dtype']} {r['ms']:.1f}" for r in rows))
    return rows


def _model_step_fns(model, x, labels, options):
    """Compiled loss-gradient (train mode) and forward (eval mode) closures of ``model``."""
    from flax import nnx

    model.train()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(p, r, x):
        logits = nnx.merge(graphdef, p, r, copy=True)(x).astype(jnp.float32)
        onehot = jax.nn.one_hot(jnp.asarray(labels), 10, dtype=jnp.float32)
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * onehot, axis=-1))

    grad = jax.jit(jax.grad(loss)).lower(params, rest, x).compile(compiler_options=options)
    model.eval()
    graphdef_e, state_e = nnx.split(model)
    fwd = jax.jit(lambda st, x: nnx.merge(graphdef_e, st, copy=True)(x))
    fwd = fwd.lower(state_e, x).compile(compiler_options=options)
    return (
        lambda: jax.block_until_ready(grad(params, rest, x)),
        lambda: jax.block_until_ready(fwd(state_e, x)),
    )


def run_model(args, use_torch):
    """ResNet-18 (CIFAR stem, batch 32) loss gradient and forward: native XLA convs vs the
    autotuned per-shape choices, under each ``--model-flags`` set and layout, beside PyTorch
    eager in both memory formats. All variants of one precision run in the same interleaved
    rounds, so layouts and PyTorch compare under the same load."""

    from layoutlab import models, nn
    from layoutlab.bench.tuning.convs import autotune_model
    from layoutlab.nn.conv_algos import algorithm_values
    from layoutlab.nn.conv_config import settings_of

    rows = []
    batch, size = 32, 32
    rng = np.random.default_rng(0)
    images = rng.standard_normal((batch, size, size, 3)).astype(np.float32)
    labels = rng.integers(0, 10, batch)
    cache = Path(args.out) / "conv_algos_autotune_cache.json"
    for precision in args.model_precisions:
        variants, meta = {}, {}
        for layout in args.model_layouts:
            base = models.create(
                "resnet18", layout=layout, num_classes=10, stem="cifar", policy=precision
            )
            x = jnp.asarray(images if layout == "NHWC" else np.transpose(images, (0, 3, 1, 2)))
            for flags in args.model_flags:
                options = FLAG_SETS[flags]
                for variant in ("xla", "auto", "auto+hwio"):
                    if variant == "auto+hwio" and layout == "NHWC":
                        continue
                    m = base
                    info = {"layout": layout, "flags": flags}
                    if variant != "xla":  # models.create's convs run xla
                        # Tune under the options the step is compiled with; the plan is
                        # part of the model the step below traces.
                        t0 = time.perf_counter()
                        tuned = autotune_model(
                            m, x, cache=cache, repeats=args.repeats, compiler_options=options
                        )
                        info["autotune_s"] = time.perf_counter() - t0
                        info["choices"] = {r.spec_key: r.choice for r in tuned.results}
                        values = algorithm_values(tuned.plan.algorithms().values())
                        m = nn.configure(m, tuned.plan, algorithms=values)
                    if variant.endswith("hwio"):
                        hwio = {
                            p: s.replace(kernel_storage="channels_last")
                            for p, s in settings_of(m).items()
                        }
                        m = nn.configure(m, hwio)
                    train, infer = _model_step_fns(m, x, labels, options)
                    name = f"{layout} {variant}/{flags}"
                    variants[("train", name)], variants[("infer", name)] = train, infer
                    meta[name] = info
            if use_torch:
                for (mode, _), fn in torch_model_fns(images, labels, layout, precision).items():
                    variants[(mode, f"{layout} torch")] = fn
                    meta[f"{layout} torch"] = {"layout": layout, "flags": None}
        ms = interleaved_ms(variants, args.repeats)
        for (mode, variant), v in ms.items():
            rows.append(
                {"precision": precision, "mode": mode, "variant": variant, "ms": v, **meta[variant]}
            )
        print(
            f"[model] {precision}: " + ", ".join(f"{k[0]}/{k[1]} {v:.1f}" for k, v in ms.items()),
            flush=True,
        )
    return rows


def _torch_resnet18_cifar():
    """torchvision's ResNet-18 with the CIFAR stem (3x3 conv, no max pool), written out so
    torchvision is not needed."""
    import torch
    from torch import nn as tnn

    class Block(tnn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = tnn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = tnn.BatchNorm2d(cout)
            self.conv2 = tnn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = tnn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = tnn.Sequential(
                    tnn.Conv2d(cin, cout, 1, stride, bias=False), tnn.BatchNorm2d(cout)
                )

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    layers = [tnn.Conv2d(3, 64, 3, 1, 1, bias=False), tnn.BatchNorm2d(64), tnn.ReLU()]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(512, 10)]
    return tnn.Sequential(*layers)


def torch_model_fns(images, labels, layout, precision):
    import torch

    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
    model = _torch_resnet18_cifar().to(memory_format=fmt)
    x = torch.from_numpy(np.ascontiguousarray(np.transpose(images, (0, 3, 1, 2))))
    x = x.contiguous(memory_format=fmt)
    y = torch.from_numpy(labels).long()
    amp = precision != "fp32"

    def train():
        model.train()
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()

    def infer():
        model.eval()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            model(x)

    return {("train", "torch"): train, ("infer", "torch"): infer}


# ---------------------------------------------------------------- report


def markdown(results: dict) -> str:
    m = results["machine"]
    v = m["versions"]
    lines = [
        "# Conv algorithms on CPU (ResNet-18 conv shapes)",
        "",
        f"Machine: {m['cpu_model']}, {m['usable_cores']} usable cores, "
        f"{m['device_kind']}; jax {v.get('jax')}, jaxlib {v.get('jaxlib')}, "
        f"torch {v.get('torch')} (threads {m.get('torch_threads')}). Load average at start "
        f"{m.get('load_average')}, at end {results.get('load_average_end')}.",
        "",
        f"Note: {m.get('note')}",
        "",
        "Times are medians (ms) of interleaved rounds (A B C A B C ...), "
        f"{results['repeats']} rounds. `train` = forward + input and weight gradients. "
        "`best` = fastest algorithm whose numerics pass (max error / max |ref| vs float64 "
        "within `conv_tolerance`); ratio = torch / layoutlab (>1: layoutlab faster).",
        "",
    ]
    rows = results["rows"]
    for part in ("cifar", "imagenet"):
        prow = [r for r in rows if r.get("part") == part]
        if not prow:
            continue
        lines += [
            f"## {part} (batch {BATCH[part]})",
            "",
        ]
        table = []
        keys = dict.fromkeys((r["shape"], r["dtype"], r["layout"]) for r in prow)
        for key in keys:
            group = [r for r in prow if (r["shape"], r["dtype"], r["layout"]) == key]
            algs = [
                r
                for r in group
                if r["algorithm"] != "torch"
                and r["passed"] is not False
                and r["train_ms"] is not None
            ]
            xla = next(r for r in group if r["algorithm"] == "xla")
            torch_r = next((r for r in group if r["algorithm"] == "torch"), None)
            bf = min(algs, key=lambda r: r["forward_ms"])
            bt = min(algs, key=lambda r: r["train_ms"])
            t = (lambda k, r=torch_r: f"{r[k]:.1f}") if torch_r else (lambda k: "n/a")
            ratio = f"{torch_r['train_ms'] / bt['train_ms']:.2f}" if torch_r else "n/a"
            table.append(
                (
                    *key,
                    f"{xla['forward_ms']:.1f}",
                    f"{bf['forward_ms']:.1f} ({bf['algorithm']})",
                    t("forward_ms"),
                    f"{xla['train_ms']:.1f}",
                    f"{bt['train_ms']:.1f} ({bt['algorithm']})",
                    t("train_ms"),
                    ratio,
                )
            )
        lines += markdown_grid(
            ("shape", "dtype", "layout", "xla fwd", "best fwd", "torch fwd", "xla train",
             "best train", "torch train", "torch/best train"),
            table,
        )  # fmt: skip
        lines += ["", "### Numerics: max |error| / max |float64 ref| (y, dx, dw)", ""]
        table, seen = [], set()
        for r in prow:
            key = (r["shape"], r["dtype"], r["algorithm"])
            if r["errors"] is None or key in seen:
                continue
            seen.add(key)
            e = r["errors"]
            errs = (f"{e.get(k, 0):.1e}" for k in ("y", "dx", "dw"))
            table.append((*key, *errs, r["passed"]))
        header = ("shape", "dtype", "algorithm", "y", "dx", "dw", "passed")
        lines += [*markdown_grid(header, table), ""]
    flags = results.get("flags") or []
    if flags:
        lines += [
            "## XLA:CPU compile options (float32 NHWC)",
            "",
        ]
        table = []
        keys = dict.fromkeys((r["shape"], r["algorithm"], r["flags"]) for r in flags)
        for k in keys:
            g = {r.get("mode"): r for r in flags if (r["shape"], r["algorithm"], r["flags"]) == k}
            if None in g:
                table.append((*k, f"rejected: {g[None]['error'][:80]}", ""))
                continue
            table.append((*k, f"{g['fwd']['ms']:.1f}", f"{g['train']['ms']:.1f}"))
        header = ("shape", "algorithm", "flags", "fwd ms", "train ms")
        lines += [*markdown_grid(header, table), ""]
    dtypes = results.get("dtypes") or []
    if dtypes:
        lines += [
            "## bfloat16 operands (float32 accumulation) vs float32",
            "",
            *markdown_grid(
                ("op", "dtype", "ms"), ((r["op"], r["dtype"], f"{r['ms']:.1f}") for r in dtypes)
            ),
            "",
        ]
    model = results.get("model") or []
    if model:
        lines += [
            "## ResNet-18 CIFAR, batch 32 (whole model)",
            "",
            "All variants of a precision ran in the same interleaved rounds. `torch` is "
            "eager PyTorch (NHWC = channels_last memory, NCHW = contiguous); the last column "
            "divides PyTorch's best time (either memory format) by this row's (>= 1: "
            "layoutlab at least as fast).",
            "",
        ]
        table = []
        for r in model:
            best_torch = min(
                (
                    q["ms"]
                    for q in model
                    if q["variant"].endswith("torch")
                    and (q["precision"], q["mode"]) == (r["precision"], r["mode"])
                ),
                default=None,
            )
            ratio = f"{best_torch / r['ms']:.2f}" if best_torch else "n/a"
            table.append((r["precision"], r["mode"], r["variant"], f"{r['ms']:.1f}", ratio))
        header = ("precision", "mode", "variant", "ms", "best torch / this")
        lines += [*markdown_grid(header, table), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="cifar,imagenet,flags,dtypes,model")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--layouts", default="NHWC,NCHW")
    p.add_argument("--model-precisions", default="fp32")
    p.add_argument("--model-layouts", default="NHWC,NCHW")
    p.add_argument(
        "--model-flags",
        default="default,ynn_dots_only",
        help=f"XLA option sets for the model part, from: {', '.join(FLAG_SETS)}",
    )
    p.add_argument(
        "--flags",
        default="default",
        help="XLA option set the shape parts compile with (one of the --model-flags names)",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--nchw-top",
        type=int,
        default=1,
        help="NCHW: time xla and this many of the fastest NHWC candidates",
    )
    p.add_argument(
        "--xla-variants",
        default="ynn_dots_only",
        help="flag sets under which native xla is timed as an extra candidate ('xla@SET')",
    )
    p.add_argument("--no-torch", action="store_true")
    p.add_argument(
        "--note",
        default="shared 2-core VM: other engineers' test suites ran "
        "during the measurement, so absolute times are noisy; candidates were "
        "interleaved so ratios are fairer than absolutes",
    )
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--tag", default="cpu", help="output names: conv_algos_<tag>.json/.md")
    p.add_argument(
        "--quick",
        action="store_true",
        help="CIFAR shapes, float32, NHWC and NCHW, no model part (a few minutes)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.parts, args.dtypes = "cifar,flags,dtypes", "float32"
    args.parts = [s for s in args.parts.split(",") if s]
    args.dtypes = [s for s in args.dtypes.split(",") if s]
    args.layouts = [s.upper() for s in args.layouts.split(",") if s]
    args.model_precisions = [s for s in args.model_precisions.split(",") if s]
    args.model_flags = [s for s in args.model_flags.split(",") if s]
    args.model_layouts = [s.upper() for s in args.model_layouts.split(",") if s]
    args.xla_variants = [s for s in args.xla_variants.split(",") if s]
    for name in [*args.model_flags, args.flags, *args.xla_variants]:
        if name not in FLAG_SETS:
            p.error(f"unknown flag set {name!r}; use one of {', '.join(FLAG_SETS)}")
    use_torch = not args.no_torch
    if use_torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("torch not installed: measuring JAX only", file=sys.stderr)
            use_torch = False
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results = {
        "machine": machine_info("cpu", note=args.note),
        "repeats": args.repeats,
        "shape_flags": {args.flags: FLAG_SETS[args.flags]},
        "rows": [],
        "flags": [],
        "model": [],
    }
    shapes = {"cifar": CIFAR, "imagenet": IMAGENET}
    for part in args.parts:
        if part in shapes:
            results["rows"] += run_shapes(part, shapes[part], args, use_torch)
        elif part == "flags":
            results["flags"] = run_flags(args)
        elif part == "dtypes":
            results["dtypes"] = run_dtypes(args)
        elif part == "model":
            results["model"] = run_model(args, use_torch)
        else:
            p.error(f"unknown part {part!r}; use cifar, imagenet, flags, dtypes, model")
    results["machine"] = {
        **results["machine"],
        **{"torch_threads": machine_info("cpu")["torch_threads"]},
    }
    results["load_average_end"] = machine_info("cpu")["load_average"]
    results["wall_s"] = time.perf_counter() - t0
    stem = out / f"conv_algos_{args.tag}"
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str))
    stem.with_suffix(".md").write_text(markdown(results))
    print(f"wrote {stem}.json and .md in {results['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
