"""Where a train-mode gradient error left on float64's decisions comes from (ResNet-50 at
64x64, benchmarks/results/grad_numerics_torchvision_cpu.md): PyTorch's own float32 run
against float64, both with every ReLU/max-pool decision pinned to float64's, compared at
every BatchNorm (the error of its normalized input ``xhat`` in the forward, of the
gradient at its output and at its input in the backward); then one BatchNorm's backward
alone, layoutlab's VJP and PyTorch's, fed exact inputs, the PyTorch float32 run's or
layoutlab's own jitted forward's.

    PYTHONPATH=src python3 benchmarks/archive/grad_numerics_batch_norm.py [model [seed [width]]]
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "helpers"))

import grad_audit as ga  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from layoutlab.nn.norm import batch_norm_train  # noqa: E402


def pinned_run(tm, x, ct, ref, dtype):
    """``{bn name: (input, xhat, grad at output, grad at input)}`` (float64 arrays) of one
    train-mode run of ``tm`` in ``dtype`` on ``ref``'s decisions."""
    model = copy.deepcopy(tm).to(dtype).train()
    seen, kept = {}, []

    def keep(name):
        def hook(module, args, out):
            a = args[0]
            a.retain_grad()
            out.retain_grad()
            v = a.detach().double()
            mean = v.mean((0, 2, 3), keepdim=True)
            var = ((v - mean) ** 2).mean((0, 2, 3), keepdim=True)
            seen[name] = (a, out, v.numpy(), ((v - mean) / (var + module.eps).sqrt()).numpy())

        return hook

    kept = [
        m.register_forward_hook(keep(n))
        for n, m in model.named_modules()
        if isinstance(m, nn.BatchNorm2d)
    ]
    xt = torch.from_numpy(x).to(dtype)
    with ga.torch_decided(model, ref.decisions):
        out = model(xt)
    (out * torch.from_numpy(ct).to(dtype)).sum().backward()
    for h in kept:
        h.remove()
    grad = lambda t: t.grad.double().numpy()  # noqa: E731
    return {n: (v, xhat, grad(o), grad(a)) for n, (a, o, v, xhat) in seen.items()}


def torch_backward(x, dy, weight, bias, dtype):
    xt = torch.from_numpy(x).to(dtype).requires_grad_(True)
    w = torch.from_numpy(weight).to(dtype).requires_grad_(True)
    b = torch.from_numpy(bias).to(dtype)
    F.batch_norm(xt, None, None, w, b, training=True, eps=1e-5).backward(
        torch.from_numpy(dy).to(dtype)
    )
    return xt.grad.double().numpy(), w.grad.double().numpy()


def layoutlab_backward(x, dy, weight, bias):
    """``batch_norm_train``'s VJP, jitted, NHWC as the models run it."""
    nhwc = lambda a: jnp.asarray(a.transpose(0, 2, 3, 1), jnp.float32)  # noqa: E731

    def f(a, s, b):
        return batch_norm_train(a, s, b, (0, 1, 2), 1e-5)[0]

    args = (nhwc(x), jnp.asarray(weight, jnp.float32), jnp.asarray(bias, jnp.float32))
    _, vjp = jax.vjp(f, *args)
    dx, dscale, _ = jax.jit(vjp)(nhwc(dy))
    return np.asarray(dx, np.float64).transpose(0, 3, 1, 2), np.asarray(dscale, np.float64)


def layoutlab_input(name, tm, x, bn: str, **kw):
    """The input of BatchNorm ``bn`` (a ResNet's: the output of the conv of the same
    number) in layoutlab's own jitted train-mode forward, NCHW float64; None elsewhere."""
    from layoutlab.compare.layer_recording import layer_outputs

    conv = bn.rsplit(".", 1)
    conv = f"{conv[0]}.conv{conv[1][2:]}" if conv[-1].startswith("bn") else None
    model = ga.layoutlab_model(name, tm, "NCHW", True, True, x, **kw)
    _, records = layer_outputs(model, ga.to_model_input(x, model), train=True)
    found = [r.value for r in records if r.path == conv]
    return np.asarray(found[0], np.float64) if found else None


def main(argv):
    torch.set_num_threads(1)
    name = argv[0] if argv else "resnet50"
    seed = int(argv[1]) if len(argv) > 1 else 0
    kw = {"width": int(argv[2])} if len(argv) > 2 else {}
    tm, x, ct = ga.problem(name, seed, 4, 64, **kw)
    ref = ga.reference(tm, x, ct, True)
    exact, run32 = (pinned_run(tm, x, ct, ref, dt) for dt in (torch.float64, torch.float32))
    print("| BatchNorm | values per channel | xhat (forward) | grad at output | grad at input |")
    print("|---|---|---|---|---|")
    for bn, (v, xhat, gout, gin) in exact.items():
        v32, xhat32, gout32, gin32 = run32[bn]
        per_channel = v.size // v.shape[1]
        errs = [ga.normwise(a, e) for a, e in ((xhat32, xhat), (gout32, gout), (gin32, gin))]
        print(f"| {bn} | {per_channel} | " + " | ".join(f"{e:.1e}" for e in errs) + " |")
    last = list(exact)[-1]
    module = dict(tm.named_modules())[last]
    weight, bias = (p.detach().numpy().astype(np.float64) for p in (module.weight, module.bias))
    x64, dy64 = exact[last][0], exact[last][2]
    x32, dy32 = run32[last][0], run32[last][2]
    dx_ref, dscale_ref = torch_backward(x64, dy64, weight, bias, torch.float64)
    xll = layoutlab_input(name, tm, x, last, **kw)
    print(f"\n{last}'s input off float64: PyTorch float32 {ga.normwise(x32, x64):.1e}", end="")
    if xll is not None:
        print(f", layoutlab (jitted, shipped plan) {ga.normwise(xll, x64):.1e}", end="")
    print()
    print(f"\n{last}'s backward alone, dx / dscale against float64 arithmetic on exact inputs:")
    print("| inputs | PyTorch float32 | layoutlab VJP | float64 arithmetic |")
    print("|---|---|---|---|")
    cases = {
        "exact x and dy (rounded to float32)": (x64, dy64),
        "PyTorch float32 run's x and dy": (x32, dy32),
        "PyTorch float32 run's x, exact dy": (x32, dy64),
        "exact x, PyTorch float32 run's dy": (x64, dy32),
    }
    if xll is not None:
        cases["layoutlab run's x, exact dy"] = (xll, dy64)
    for label, (xin, dy) in cases.items():
        cells = []
        for got in (
            torch_backward(xin, dy, weight, bias, torch.float32),
            layoutlab_backward(xin, dy, weight, bias),
            torch_backward(xin, dy, weight, bias, torch.float64),
        ):
            cells.append(
                f"{ga.normwise(got[0], dx_ref):.1e} / {ga.normwise(got[1], dscale_ref):.1e}"
            )
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
