"""Every distinct conv of ResNet-18 CIFAR and ResNet-50 ImageNet: forward, input gradient (dx)
and weight gradient (dw), by XLA's conv (``xla``), oneDNN through XLA FFI (``onednn``) and
PyTorch eager (oneDNN too), at batch 1 and 32, float32 and bfloat16, one conv at a time.

    python benchmarks/onednn_conv_table.py --out benchmarks/results/onednn_conv_table_cpu
    python benchmarks/onednn_conv_table.py --smoke          # one conv, a few rounds: it runs

The convs come from the models themselves (``nn.conv_config.model_conv_specs``), NHWC with
HWIO kernels. PyTorch's wheel and the oneDNN wheel share one OpenMP runtime per process (one
soname); this script loads layoutlab's first, so both run with the wait policy layoutlab sets
(PASSIVE) unless ``OMP_WAIT_POLICY`` is given (``ACTIVE`` is PyTorch's own default). Each
pass is its own jitted program: ``fwd`` the conv, ``dx`` and ``dw`` the VJP with respect to
one operand (the other's gradient and the forward are dead code). layoutlab's convs are
compiled with the XLA:CPU options a run of that mode uses (``cpu_fast_options``). bfloat16 is
mixed precision as ``mixed_bf16`` runs it: bf16 operands, float32 accumulation and output;
PyTorch gets bf16 channels_last tensors (autocast's conv, without its casts); its ``dx`` and
``dw`` are ``torch.autograd.grad`` of one kept forward graph, so they time the backward pass
alone (before 2026-12-06 they ran the forward too, which roughly doubled them). Per conv,
batch, dtype and pass, the three cases are compiled and warmed up, then timed round by round
(A B C A B C ...), a block of calls each, so they share the machine's load. A row gives each
median in ms and GF/s, and the paired per-round ratios ``xla / onednn`` and
``torch / onednn`` (above 1: oneDNN through XLA is faster) with their 95% intervals.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from layoutlab import models
from layoutlab.bench.machine import finish_machine_info, machine_info
from layoutlab.bench.stats import paired_ratio
from layoutlab.bench.timing import block_rounds
from layoutlab.fast_defaults import cpu_fast_options
from layoutlab.nn.conv_algos import conv2d, get_algorithm
from layoutlab.nn.conv_algos.onednn import status_line
from layoutlab.nn.conv_algos.onednn_load import wait_policy
from layoutlab.nn.conv_config import model_conv_specs

MODELS = {
    "resnet18_cifar": ("resnet18", {"stem": "cifar", "num_classes": 10}, 32),
    "resnet50_imagenet": ("resnet50", {"num_classes": 1000}, 224),
}
PASSES = ("fwd", "dx", "dw")
CASES = ("xla", "onednn", "torch")


def distinct_convs(model_names) -> list[tuple[str, object]]:
    """``[(model, spec)]``: each model's distinct convs at batch 1, in call order."""
    out, seen = [], set()
    for name in model_names:
        arch, kw, size = MODELS[name]
        model = models.create(arch, **kw)
        x = jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32)
        for spec in model_conv_specs(model, x):
            if spec.key() not in seen:
                seen.add(spec.key())
                out.append((name, spec))
    return out


def _arrays(spec, batch, dtype):
    g = spec.geometry
    (h, w), c, o = spec.in_size, spec.in_features, spec.out_features
    ho, wo = g.out_size((h, w))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, h, w, c), dtype=np.float32)
    k = rng.standard_normal((*g.kernel_size, c // g.groups, o), dtype=np.float32)
    k /= np.sqrt(k[..., 0].size)
    dy = rng.standard_normal((batch, ho, wo, o), dtype=np.float32)
    return x, k, dy


def _jax_case(algorithm, spec, pass_, dtype, batch, arrays):
    g = spec.geometry
    preferred = jnp.float32 if dtype == "bfloat16" else None

    def conv(a, b):
        return conv2d(a, b, strides=g.strides, padding=g.padding, dilation=g.dilation,
                      groups=g.groups, algorithm=algorithm, impl=get_algorithm(algorithm),
                      preferred_element_type=preferred)  # fmt: skip

    fns = {
        "fwd": lambda x, w, dy: conv(x, w),
        "dx": lambda x, w, dy: jax.vjp(lambda a: conv(a, w), x)[1](dy)[0],
        "dw": lambda x, w, dy: jax.vjp(lambda b: conv(x, b), w)[1](dy)[0],
    }
    x, w = (jnp.asarray(a, dtype) for a in arrays[:2])
    dy = jnp.asarray(arrays[2], preferred or dtype)
    options = cpu_fast_options("infer" if pass_ == "fwd" else "train", "pytorch", batch=batch)
    compiled = jax.jit(fns[pass_]).lower(x, w, dy).compile(compiler_options=options)
    return lambda: jax.block_until_ready(compiled(x, w, dy)), compiled


def _torch_case(spec, pass_, dtype, arrays):
    import torch  # after layoutlab's OpenMP runtime (see the module docstring)

    g = spec.geometry
    tdt = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    x = torch.from_numpy(arrays[0]).permute(0, 3, 1, 2).to(tdt)
    w = torch.from_numpy(np.ascontiguousarray(arrays[1].transpose(3, 2, 0, 1))).to(tdt)
    dy = torch.from_numpy(arrays[2]).permute(0, 3, 1, 2).to(tdt)
    x, w, dy = (t.contiguous(memory_format=torch.channels_last) for t in (x, w, dy))
    (plh, prh), (plw, prw) = g.padding
    if (plh, plw) != (prh, prw):  # PyTorch pads symmetrically: pad the input itself
        x = torch.nn.functional.pad(x, (plw, prw, plh, prh)).contiguous(
            memory_format=torch.channels_last
        )
        plh = plw = 0
    x.requires_grad_(pass_ == "dx")
    w.requires_grad_(pass_ == "dw")

    def conv():
        return torch.nn.functional.conv2d(
            x, w, stride=g.strides, padding=(plh, plw), dilation=g.dilation, groups=g.groups
        )

    if pass_ == "fwd":

        def run():
            with torch.no_grad():
                return conv()

        return run
    # The backward pass alone, as on the JAX side (where the forward is dead code): the graph
    # of one forward, kept, differentiated on every call.
    y = conv()
    wrt = x if pass_ == "dx" else w

    def run():
        return torch.autograd.grad(y, wrt, dy, retain_graph=True)

    return run


def _flops(spec, batch) -> float:
    ho, wo = spec.out_size
    return 2.0 * batch * ho * wo * spec.out_features * spec.reduction


def _ratio(slow, fast) -> str:
    r = paired_ratio(slow, fast)
    return f"{r.value:.2f} [{r.low:.2f}, {r.high:.2f}]" if r else "-"


def _custom_calls(compiled) -> int:
    return compiled.as_text().count('custom_call_target="layoutlab_onednn_')


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batches", default="1,32")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--passes", default=",".join(PASSES))
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--block", type=int, default=5, help="timed calls per case per round")
    p.add_argument("--limit", type=int, help="only the first LIMIT distinct convs")
    p.add_argument("--match", help="only convs whose key contains MATCH (e.g. 16x16:128->128)")
    p.add_argument("--smoke", action="store_true", help="one conv, batch 1, 3 rounds of 1 call")
    p.add_argument("--out", help="folder for onednn_conv_table.json")
    args = p.parse_args(argv)
    if args.smoke:
        args.models, args.batches, args.rounds, args.block, args.limit = (
            "resnet18_cifar", "1", 3, 1, 2,
        )  # fmt: skip
    print(status_line(), f"(OpenMP wait policy: {wait_policy()})")
    machine = machine_info("cpu")
    convs = distinct_convs(args.models.split(","))
    convs = [c for c in convs if args.match is None or args.match in c[1].key()][: args.limit]
    rows = []
    print("| model | conv | n | dtype | pass | xla ms | onednn ms | torch ms | xla GF/s | "
          "onednn GF/s | torch GF/s | xla/onednn [95%] | torch/onednn [95%] |")  # fmt: skip
    print("|" + "---|" * 13)
    for batch in (int(b) for b in args.batches.split(",")):
        for dtype in args.dtypes.split(","):
            for model, spec in convs:
                arrays = _arrays(spec, batch, dtype)
                for pass_ in args.passes.split(","):
                    xla, _ = _jax_case("xla", spec, pass_, dtype, batch, arrays)
                    one, compiled = _jax_case("onednn", spec, pass_, dtype, batch, arrays)
                    calls = _custom_calls(compiled)
                    cases = {"xla": xla, "onednn": one, "torch": _torch_case(spec, pass_, dtype,
                                                                             arrays)}  # fmt: skip
                    times = block_rounds(cases, args.rounds, args.block, warmup=2)
                    med = {k: statistics.median(v) for k, v in times.items()}
                    gf = {k: _flops(spec, batch) / (m * 1e6) for k, m in med.items()}
                    key = spec.key().split(":", 2)[2].rsplit(":", 1)[0]
                    name = key + ("" if calls == 1 else f" ({calls} oneDNN calls)")
                    print(f"| {model} | {name} | {batch} | {dtype} | {pass_} | "
                          + " | ".join(f"{med[k]:.3f}" for k in CASES) + " | "
                          + " | ".join(f"{gf[k]:.0f}" for k in CASES) + " | "
                          + f"{_ratio(times['xla'], times['onednn'])} | "
                          + f"{_ratio(times['torch'], times['onednn'])} |", flush=True)  # fmt: skip
                    rows.append(
                        {"model": model, "conv": key, "batch": batch, "dtype": dtype,
                         "pass": pass_, "onednn_calls": calls, "round_ms": times}
                    )  # fmt: skip
    if args.out:
        path = Path(args.out) / "onednn_conv_table.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        result = {"machine": finish_machine_info(machine), "onednn": status_line(),
                  "omp_wait_policy": wait_policy(), "rows": rows}  # fmt: skip
        path.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
