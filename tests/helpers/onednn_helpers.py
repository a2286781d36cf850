"""Shared by the oneDNN conv tests: conv cases (named geometries and fuzzed ones), their
inputs, the algorithm's training step and the float64 reference it is checked against.

Reference: XLA's conv in float64 (``jax.enable_x64``) of the same float32 inputs, and its VJP,
which is independent of oneDNN. Tolerance: ``conv_tolerance(dtype, K)`` (see
``tests/nn/test_onednn_conv.py``'s docstring for its two terms).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from layoutlab.bench.tuning.conv_reference import conv_tolerance, spec_inputs
from layoutlab.compare import compare
from layoutlab.nn import conv_algos as ca
from layoutlab.nn.conv_algos import onednn

__all__ = [
    "BF16_CASES",
    "needs_onednn",
    "simulate_no_onednn",
    "train_together",
    "CASES",
    "FAST_COMPILE",
    "case_inputs",
    "case_spec",
    "check_against_float64",
    "conv_fn",
    "float64_reference",
    "float64_references",
    "float64_train",
    "fuzzed_cases",
    "train_fn",
]

FAST_COMPILE = {"xla_backend_optimization_level": 0}  # single convs, no ReLU: see test_conv_algos


def fuzzed_cases(count: int, seed: int = 0):
    """``count`` random conv geometries: kernel 1/3/5, stride 1/2, dilation 1/2, groups 1, 2 or
    depthwise, explicit (lo, hi) padding in [0, k - 1] each."""
    rng = np.random.default_rng(seed)
    cases = {}
    while len(cases) < count:
        k = int(rng.choice([1, 3, 5]))
        s, d = int(rng.choice([1, 2])), int(rng.choice([1, 1, 2]))
        c = int(rng.choice([4, 8, 12]))
        g = int(rng.choice([1, 2, c]))
        o = c if g == c else int(rng.choice([4, 8, 16]))
        pads = tuple(tuple(int(v) for v in rng.integers(0, k, 2)) for _ in range(2))
        h, w = (int(v) for v in rng.integers(max(6, (k - 1) * d + 1), 12, 2))
        cases[f"fuzz{len(cases)}"] = ((2, h, w, c), (k, k, c // g, o), s, pads, d, g)
    return cases


# (x NHWC, kernel HWIO, strides, padding, dilation, groups)
needs_onednn = pytest.mark.skipif(
    not onednn.available(), reason=f"onednn extension: {onednn.unavailable_reason()}"
)


def simulate_no_onednn(monkeypatch) -> None:
    """The extension as where it did not build or load, for the rest of the test."""
    monkeypatch.setattr(onednn, "available", lambda: False)
    monkeypatch.setattr(onednn, "unavailable_reason", lambda: "simulated: not built")


CASES = {
    "3x3s1": ((2, 7, 9, 8), (3, 3, 8, 16), 1, "SAME", 1, 1),
    "3x3s2": ((2, 9, 8, 8), (3, 3, 8, 12), 2, "SAME", 1, 1),
    "1x1s1": ((2, 5, 6, 8), (1, 1, 8, 16), 1, 0, 1, 1),
    "1x1s2": ((2, 8, 8, 16), (1, 1, 16, 32), 2, 0, 1, 1),
    "7x7s2_rgb": ((1, 15, 15, 3), (7, 7, 3, 8), 2, 3, 1, 1),
    "3x3_dilated": ((1, 9, 9, 8), (3, 3, 8, 8), 1, "SAME", 2, 1),
    "3x3_groups4": ((2, 8, 8, 16), (3, 3, 4, 16), 1, 1, 1, 4),
    "dw3x3s1": ((2, 7, 9, 8), (3, 3, 1, 8), 1, "SAME", 1, 8),
    "dw3x3s2": ((2, 9, 8, 16), (3, 3, 1, 16), 2, 1, 1, 16),
    "asym_pad": ((1, 6, 7, 4), (3, 3, 4, 8), 1, ((0, 2), (1, 0)), 1, 1),
    "3x3_many_pixels": ((4, 17, 17, 16), (3, 3, 16, 8), 1, "SAME", 1, 1),
    # Batch 8: a strided conv whose bfloat16 weight gradient runs oneDNN's own kernel.
    "3x3s2_batch8": ((8, 9, 9, 16), (3, 3, 16, 16), 2, 1, 1, 1),
    **fuzzed_cases(6),
}
BF16_CASES = (
    "3x3s1", "3x3s2", "1x1s2", "7x7s2_rgb", "dw3x3s2", "3x3_groups4", "3x3_many_pixels",
    "3x3s2_batch8", "fuzz0", "fuzz1",
)  # fmt: skip


def case_spec(case, layout, dtype="float32"):
    xs, ws, s, p, d, g = CASES[case]
    if layout == "NCHW":
        xs = (xs[0], xs[3], xs[1], xs[2])
    return ca.conv_spec(
        xs, ws, strides=s, padding=p, dilation=d, groups=g, layout=layout,
        kernel_layout="HWIO", dtype=dtype,
    )  # fmt: skip


def conv_fn(spec, algorithm, preferred=None):
    g = spec.geometry

    def f(x, w):
        return ca.conv2d(
            x, w, strides=g.strides, padding=g.padding, dilation=g.dilation, groups=g.groups,
            layout=spec.layout, kernel_layout="HWIO", algorithm=algorithm,
            preferred_element_type=preferred,
        )  # fmt: skip

    return f


def train_fn(spec, algorithm, preferred=None):
    """``(x, w, dy) -> (y, dx, dw)``."""
    f = conv_fn(spec, algorithm, preferred)

    def train(x, w, dy):
        y, vjp = jax.vjp(f, x, w)
        return (y, *vjp(dy.astype(y.dtype)))

    return train


def case_inputs(spec, seed):
    x, w, dy = spec_inputs(spec, seed=seed)
    if spec.layout == "NCHW":  # spec_inputs gives the layout's kernel order (OIHW)
        w = np.transpose(w, (2, 3, 1, 0))
    return x, w, dy


def float64_train(spec):
    g = spec.geometry
    dims = (spec.layout, "HWIO", spec.layout)

    def f(a, b):
        return lax.conv_general_dilated(
            a, b, g.strides, g.padding, rhs_dilation=g.dilation, dimension_numbers=dims,
            feature_group_count=g.groups, precision=lax.Precision.HIGHEST,
        )  # fmt: skip

    def train(x, w, dy):
        y, vjp = jax.vjp(f, x, w)
        return dict(zip(("y", "dx", "dw"), (y, *vjp(dy)), strict=True))

    return train


def float64_references(specs: dict) -> dict:
    """``{key: {"y", "dx", "dw"}}`` in float64 of ``{key: (spec, (x, w, dy))}``, one program."""
    with jax.enable_x64(True):
        args = {k: tuple(jnp.asarray(a, jnp.float64) for a in v[1]) for k, v in specs.items()}
        fns = {k: float64_train(v[0]) for k, v in specs.items()}
        run = jax.jit(lambda args: {k: fn(*args[k]) for k, fn in fns.items()})
        outs = run.lower(args).compile(FAST_COMPILE)(args)
        return jax.tree.map(np.asarray, outs)


def float64_reference(spec, x, w, dy):
    return float64_references({"one": (spec, (x, w, dy))})["one"]


def check_against_float64(spec, outs, refs, dtype):
    kh, kw = spec.geometry.kernel_size
    ho, wo = spec.out_size
    reductions = {
        "y": spec.reduction,
        "dx": kh * kw * spec.out_features // spec.geometry.groups,
        "dw": spec.batch * ho * wo,
    }
    for key, red in reductions.items():
        tol = conv_tolerance(dtype, red)
        scale = float(np.max(np.abs(refs[key])))
        actual = np.asarray(outs[key].astype(jnp.float32), np.float64)
        report = compare(actual, refs[key], rtol=tol.rtol, atol=tol.rtol * scale, name=key)
        assert report.passed, str(report)


def train_together(cases, dtype, preferred, algorithm="onednn"):
    """``{id: (y, dx, dw)}`` of every ``(case, layout)`` by ``algorithm``, compiled as one
    program."""
    fns, args = {}, {}
    for case, layout in cases:
        spec = case_spec(case, layout, jnp.dtype(dtype).name)
        key = f"{case}-{layout}"
        fns[key] = train_fn(spec, algorithm, preferred)
        args[key] = tuple(jnp.asarray(a, dtype) for a in case_inputs(spec, seed=3))

    def run(args):
        return {key: fn(*args[key]) for key, fn in fns.items()}

    return jax.jit(run).lower(args).compile(FAST_COMPILE)(args)
