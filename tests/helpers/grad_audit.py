"""The gradient audit as a test helper: a torchvision-definition model in float64
(``torchvision_defs``) against the layoutlab model holding its weights, forward and
gradients (``d(sum(logits * ct))`` w.r.t. the input and every parameter), normwise errors
``max|a - e| / max|e|``, and every ReLU/ReLU6/max-pool decision of the compiled gradient
program compared with float64's, with a rerun on float64's decisions.

``torch_float32`` measures an independent float32 implementation (PyTorch's) the same way,
the yardstick for what float32 can reach on a given problem.

``benchmarks/grad_numerics.py`` measures the results file with the same code.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torchvision_defs
from flax import nnx
from torch import nn
from torch.nn import functional as F

from layoutlab import models
from layoutlab.compare.decisions import Decision, decision_flips, probe_decisions
from layoutlab.compare.torch_decisions import torch_decisions
from layoutlab.compare.torch_weights import load_torch_state_dict, to_torch_state_dict
from layoutlab.layout import Layout


class Reference(NamedTuple):
    logits: np.ndarray
    dx: np.ndarray  # NCHW
    dparams: dict[str, np.ndarray]
    decisions: list[Decision]


class Audit(NamedTuple):
    forward: float
    dx: float
    dparams: float
    flips: list  # [(site, count)]
    pinned_dx: float | None
    pinned_dparams: float | None


def normwise(actual, expected, floor: float = 0.0) -> float:
    """``max|a - e| / max(max|e|, floor)``."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.max(np.abs(actual - expected)) / max(np.max(np.abs(expected)), floor))


def worst_param(named: dict, expected: dict) -> float:
    """The largest normwise error over the parameters. A parameter whose exact gradient is
    zero (a conv bias before a train-mode BatchNorm, which cancels it) has only rounding
    noise of ordinary-sized terms: its scale is floored at 0.1 x the median parameter's
    largest gradient (the rule of ``compare.layer_report.LayerTolerance``)."""
    floor = 0.1 * float(np.median([np.max(np.abs(g)) for g in expected.values()]))
    return max(normwise(named[k], g, floor) for k, g in expected.items())


def problem(name: str, seed: int, batch: int, size: int, num_classes: int = 10, **kw):
    """``(float64 torch model, input NCHW float64, cotangent of the logits)``: the model's
    BatchNorm gets random affine parameters and running statistics of a calibration batch
    (``torchvision_defs.randomize_batch_norm``)."""
    rng = np.random.default_rng(1000 + seed)
    x = rng.standard_normal((batch, 3, size, size))
    calibration = torch.from_numpy(rng.standard_normal((8, 3, size, size)))
    tm = torchvision_defs.build(
        name, seed=seed, calibration=calibration, num_classes=num_classes, **kw
    )
    return tm, x, rng.standard_normal((batch, num_classes))


def reference(tm, x: np.ndarray, ct: np.ndarray, train: bool) -> Reference:
    tm.train(train)
    tm.zero_grad(set_to_none=True)
    xt = torch.from_numpy(x).requires_grad_(True)
    out = tm(xt)
    (out * torch.from_numpy(ct)).sum().backward()
    dparams = {k: p.grad.numpy() for k, p in tm.named_parameters()}
    decisions, _, _ = torch_decisions(tm, x, train)
    return Reference(out.detach().numpy(), xt.grad.numpy(), dparams, decisions)


def layoutlab_model(name, tm, layout: str, train: bool, plan: bool, x, **kw) -> nnx.Module:
    """``models.create``'s model holding ``tm``'s weights (float32), in train or eval mode,
    with the shipped table's conv plan for that mode when ``plan`` (what train and compare
    run), built abstractly so no weight is drawn."""
    from layoutlab.fast_defaults import default_backend, table_cpu_kind
    from layoutlab.nn import ConvSettings, configure
    from layoutlab.nn.conv_algos import algorithm_values
    from layoutlab.nn.conv_config import default_conv_plan

    model = nnx.eval_shape(
        lambda: models.create(name, num_classes=10, layout=layout, rngs=nnx.Rngs(0), **kw)
    )
    for _, var in nnx.iter_graph(model):
        if isinstance(var, nnx.RngKey):
            var.set_value(jax.random.key(0))
        elif isinstance(var, nnx.RngCount):
            var.set_value(np.zeros(var.get_value().shape, np.uint32))
    load_torch_state_dict(model, {k: v.float() for k, v in tm.state_dict().items()})
    model.train() if train else model.eval()
    model.set_attributes(deterministic=True, raise_if_not_found=False)
    if plan:
        objective = "train" if train else "inference"
        model = configure(model, ConvSettings.named("auto"))
        xin = to_model_input(x, model)
        plan_ = default_conv_plan(model, xin, objective, table_cpu_kind(default_backend()))
        model = configure(model, plan_, algorithms=algorithm_values(plan_.algorithms().values()))
    return model


def to_model_input(x: np.ndarray, model) -> np.ndarray:
    x = np.asarray(x, np.float32)
    return x if model.layout == Layout.NCHW else x.transpose(0, 2, 3, 1)


_COMPILED: dict[Any, Any] = {}


def gradient_program(model, *, jit: bool = True, compiler_options: dict | None = None):
    """``f(params, rest, x, ct, pins) -> ((logits, decisions), (dparams, dx))`` for the
    structure of ``model``; compiled once per structure and options (pins ``None`` and a
    dict of pins are two programs)."""
    graphdef, _, _ = nnx.split(model, nnx.Param, ...)
    key = (graphdef, jit, tuple(sorted((compiler_options or {}).items())))
    if key in _COMPILED:
        return _COMPILED[key]
    sites: list[str] = []

    def loss(params, rest, x, ct, pins):
        m = nnx.merge(graphdef, params, rest, copy=True)
        with probe_decisions(m, pins) as log:
            logits = m(x)
        sites[:] = [(d.site, d.kind) for d in log.decisions]
        return jnp.sum(logits * ct), (logits, [d.value for d in log.decisions])

    grad = jax.grad(loss, argnums=(0, 2), has_aux=True)
    if jit:
        grad = jax.jit(grad, compiler_options=compiler_options or None)

    def run(params, rest, x, ct, pins):
        grads, (logits, found) = grad(params, rest, x, ct, pins)
        found = [Decision(s, k, np.asarray(v), 0) for (s, k), v in zip(sites, found, strict=True)]
        return grads, np.asarray(logits), found

    _COMPILED[key] = run
    return run


def audit(
    model, x: np.ndarray, ct: np.ndarray, ref: Reference, *, pin: bool = True, **program
) -> Audit:
    """The normwise errors of ``model``'s forward and gradients against ``ref`` and, when
    any ReLU/max-pool decision differs from float64's (``pin``), of a rerun with every
    decision pinned to float64's."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    run = gradient_program(model, **program)
    xin = to_model_input(x, model)
    ct32 = np.asarray(ct, np.float32)

    def errors(result):
        (dparams, dx), logits, found = result
        dx = np.asarray(dx)
        if model.layout != Layout.NCHW:
            dx = dx.transpose(0, 3, 1, 2)
        named = to_torch_state_dict(nnx.merge(graphdef, dparams, rest, copy=True))
        worst = worst_param(named, ref.dparams)
        return normwise(logits, ref.logits), normwise(dx, ref.dx), worst, found

    forward, dx, dparams, found = errors(run(params, rest, xin, ct32, None))
    inner = getattr(model, "compute_layout", None) or model.layout
    flips, pins = decision_flips(ref.decisions, found, Layout.NCHW, inner)
    pinned = (None, None)
    if pin and flips:
        pinned = errors(run(params, rest, xin, ct32, pins))[1:3]
    return Audit(forward, dx, dparams, [(f.site, f.count) for f in flips], *pinned)


def audit_pinned(model, x, ct, ref: Reference, decisions: list[Decision], **program) -> Audit:
    """``audit``'s errors of ``model`` run on ``decisions`` (in float64's layout, e.g. a
    modified copy of ``ref.decisions``) instead of its own."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    run = gradient_program(model, **program)
    xin, ct32 = to_model_input(x, model), np.asarray(ct, np.float32)
    _, _, found = run(params, rest, xin, ct32, None)
    inner = getattr(model, "compute_layout", None) or model.layout
    _, pins = decision_flips(decisions, found, Layout.NCHW, inner)
    (dparams, dx), logits, _ = run(params, rest, xin, ct32, pins)
    dx = np.asarray(dx)
    if model.layout != Layout.NCHW:
        dx = dx.transpose(0, 3, 1, 2)
    named = to_torch_state_dict(nnx.merge(graphdef, dparams, rest, copy=True))
    worst = worst_param(named, ref.dparams)
    return Audit(normwise(logits, ref.logits), normwise(dx, ref.dx), worst, [], None, None)


def _torch_windows(module, v):
    """``(n, c, window size, positions)``: each max-pool window of ``v``, row-major."""
    k, s, p = (
        a if isinstance(a, tuple) else (a, a)
        for a in (module.kernel_size, module.stride, module.padding)
    )
    padded = F.pad(v, (p[1], p[1], p[0], p[0]), value=-float("inf"))
    return F.unfold(padded, k, stride=s).reshape(*v.shape[:2], k[0] * k[1], -1)


def _torch_decision(module, v, out) -> np.ndarray:
    """The decision ``module`` takes on ``v`` (``Decision.value``'s convention)."""
    with torch.no_grad():
        if isinstance(module, nn.MaxPool2d):
            return torch.argmax(_torch_windows(module, v), 2).reshape(out.shape).numpy()
        if isinstance(module, nn.ReLU6):
            return ((v > 0) & (v < 6)).numpy()
        return (v > 0).numpy()


def _pin_torch(module, v, out, decision: Decision):
    """``module``'s output with its gradient routed by ``decision`` (float64's) instead of
    its own comparison: ReLU/ReLU6 pass ``v`` where the mask is True, max pool takes the
    window element ``decision`` chose."""
    value = torch.from_numpy(np.asarray(decision.value))
    if isinstance(module, nn.MaxPool2d):
        choice = value.to(torch.int64).reshape(*v.shape[:2], 1, -1)
        return torch.gather(_torch_windows(module, v), 2, choice).reshape(out.shape)
    off = torch.zeros((), dtype=v.dtype)
    if isinstance(module, nn.ReLU6):
        off = torch.where(v >= 6, torch.full((), 6.0, dtype=v.dtype), off).detach()
    return torch.where(value, v, off)


@contextlib.contextmanager
def torch_decided(model, pins: list[Decision] | None):
    """Within the block, ``model``'s ReLU/ReLU6/max-pool modules take ``pins``' decisions in
    call order (float64's, in NCHW), or their own when ``pins`` is None; yields the list of
    decisions taken."""
    sites = [m for m in model.modules() if isinstance(m, (nn.ReLU, nn.ReLU6, nn.MaxPool2d))]
    taken: list[np.ndarray] = []

    def hook(module, args, out):
        if pins is None:
            taken.append(_torch_decision(module, args[0], out))
            return None
        decision = pins[len(taken)]
        taken.append(decision.value)
        assert np.shape(decision.value) == tuple(out.shape), decision.site
        return _pin_torch(module, args[0], out, decision)

    handles = [m.register_forward_hook(hook) for m in sites]
    try:
        yield taken
    finally:
        for h in handles:
            h.remove()


def torch_float32(
    tm, x: np.ndarray, ct: np.ndarray, ref: Reference, train: bool, *, pin: bool = True
) -> Audit:
    """``audit``'s errors for PyTorch's own float32 run of ``tm`` (an implementation that
    shares no code with layoutlab): as it runs, its decision flips against float64, and
    (``pin``) rerun with every ReLU/ReLU6/max-pool decision pinned to float64's."""
    model = copy.deepcopy(tm).float()
    model.train(train)

    def run(pins):
        model.zero_grad(set_to_none=True)
        xt = torch.from_numpy(np.asarray(x, np.float32)).requires_grad_(True)
        with torch_decided(model, pins) as taken:
            out = model(xt)
        (out * torch.from_numpy(np.asarray(ct, np.float32))).sum().backward()
        dparams = {k: p.grad.numpy() for k, p in model.named_parameters()}
        errors = (
            normwise(out.detach().numpy(), ref.logits),
            normwise(xt.grad.numpy(), ref.dx),
            worst_param(dparams, ref.dparams),
        )
        return errors, taken

    (forward, dx, dparams), taken = run(None)
    pairs = zip(ref.decisions, taken, strict=True)
    counts = [(d.site, int(np.count_nonzero(d.value != t))) for d, t in pairs]
    pinned = run(ref.decisions)[0][1:] if pin else (None, None)
    return Audit(forward, dx, dparams, [(s, n) for s, n in counts if n], *pinned)
