"""Gradient numerics of torchvision-definition models against PyTorch float64: forward and
``d(sum(logits * ct))`` w.r.t. input and parameters, eager and jitted, with and without the
ReLU/max-pool decisions pinned to float64's (tests/helpers/grad_audit.py does the measuring).

    PYTHONPATH=src python3 benchmarks/grad_numerics.py resnet18:train:5 vgg11_bn:train:0 ...

Each argument is ``model[@wWIDTH][@bBATCH][@sSIZE]:mode:seed[:run,run...]`` (runs: the keys
of ``RUNS``; ``resnet50@w16`` is the tests' ResNet-50; batch 4 and the size in ``SIZES``
unless given); prints one markdown row per configuration.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))

import grad_audit as ga  # noqa: E402
import torch  # noqa: E402

from layoutlab.fast_defaults import cpu_fast_options  # noqa: E402

SIZES = {  # model: (input size, builder options)
    "resnet18": (64, {}),
    "resnet50": (64, {}),
    "mobilenet_v2": (64, {}),
    "vgg11_bn": (64, {"hidden": 512, "pool_size": 1}),
}

# jit xla-convs: models.create's model as is; jit plan: with the shipped table's conv plan
# (what train and compare run); cpu-fast: compiled with cpu_fast_options(mode); O0: with
# xla_backend_optimization_level=0; eager: jax.grad without jit; torch f32: PyTorch's own
# float32 run of the same model (ga.torch_float32), an implementation sharing no code.
RUNS = {
    "jit xla-convs": dict(plan=False, program={}),
    "jit plan": dict(plan=True, program={}),
    "jit plan cpu-fast": dict(plan=True, program="fast"),
    "jit plan O0": dict(
        plan=True, program={"compiler_options": {"xla_backend_optimization_level": 0}}
    ),
    "eager": dict(plan=False, program={"jit": False}),
    "torch f32": None,
}


def fmt(v):
    return "-" if v is None else f"{v:.1e}"


def main(argv):
    torch.set_num_threads(1)
    print(
        "| model | mode | seed | run | forward | dx | dparams | flips (site: count) "
        "| dx pinned | dparams pinned |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for arg in argv:
        label, mode, seed, *which = arg.split(":")
        name, *options = label.split("@")
        train = mode == "train"
        size, kw = SIZES[name]
        batch = 4
        for option in options:  # w: width, b: batch, s: input size
            value = int(option[1:])
            if option[0] == "w":
                kw = {**kw, "width": value}
            elif option[0] == "b":
                batch = value
            else:
                size = value
        tm, x, ct = ga.problem(name, int(seed), batch, size, **kw)
        ref = ga.reference(tm, x, ct, train)
        for run, how in RUNS.items():
            if which and run not in which[0].split(","):
                continue
            if how is None:
                r = ga.torch_float32(tm, x, ct, ref, train)
                print(row(label, mode, seed, run, r), flush=True)
                continue
            program = how["program"]
            if program == "fast":
                program = {"compiler_options": cpu_fast_options("train" if train else "infer")}
            model = ga.layoutlab_model(name, tm, "NHWC", train, how["plan"], x, **kw)
            r = ga.audit(model, x, ct, ref, **program)
            print(row(label, mode, seed, run, r), flush=True)


def row(name, mode, seed, run, r) -> str:
    flips = ", ".join(f"{s}: {n}" for s, n in r.flips) or "none"
    return (
        f"| {name} | {mode} | {seed} | {run} | {fmt(r.forward)} | {fmt(r.dx)} "
        f"| {fmt(r.dparams)} | {flips} | {fmt(r.pinned_dx)} | {fmt(r.pinned_dparams)} |"
    )


if __name__ == "__main__":
    if not sys.argv[1:] or {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        sys.exit(0)
    main(sys.argv[1:])
