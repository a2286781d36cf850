"""``onednn_xla_dw``: oneDNN's forward and input gradient, XLA's weight gradient. Forward and
both gradients against float64 (``onednn_helpers``: XLA's conv in float64 of the same
inputs; tolerance ``conv_tolerance(dtype, K)``, one term for rounding the operands to
``dtype`` and one for float32 accumulation over ``K`` products, as for ``onednn``) in both
layouts and dtypes; the program holds exactly the forward and input-gradient calls; the two
oneDNN passes are ``onednn``'s to the bit; and off CPU or without the extension, XLA's convs.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from onednn_helpers import (
    case_inputs,
    case_spec,
    check_against_float64,
    conv_fn,
    float64_references,
    needs_onednn,
    simulate_no_onednn,
    train_fn,
    train_together,
)

from layoutlab.nn import conv_algos as ca
from layoutlab.nn.conv_algos import onednn, onednn_load

HYBRID = "onednn_xla_dw"
CASES = ("3x3s1", "3x3s2", "1x1s2", "7x7s2_rgb", "3x3_groups4", "dw3x3s2", "asym_pad", "fuzz0")
PARAMS = [(c, lay) for c in CASES for lay in ("NHWC", "NCHW")]


@pytest.fixture(scope="module")
def references():
    specs = {}
    for case, layout in PARAMS:
        spec = case_spec(case, layout)
        specs[f"{case}-{layout}"] = (spec, case_inputs(spec, seed=3))
    return float64_references(specs)


@needs_onednn
@pytest.mark.parametrize(("dtype", "preferred"), [("float32", None), ("bfloat16", jnp.float32)])
def test_forward_and_both_gradients_match_float64(dtype, preferred, references):
    outputs = train_together(PARAMS, jnp.dtype(dtype), preferred, HYBRID)
    for case, layout in PARAMS:
        spec = case_spec(case, layout, dtype)
        assert ca.select_algorithm(spec, HYBRID).reason is None
        y, dx, dw = outputs[f"{case}-{layout}"]
        assert y.dtype == jnp.float32 and dx.dtype == dw.dtype == jnp.dtype(dtype)
        outs = {"y": y, "dx": dx, "dw": dw}
        check_against_float64(spec, outs, references[f"{case}-{layout}"], jnp.dtype(dtype))


def _targets(text: str) -> list[str]:
    return sorted(t for t in onednn_load.TARGETS.values() if t in text)


@needs_onednn
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_onednn_runs_the_forward_and_input_gradient_xla_the_weight_gradient(dtype):
    spec = case_spec("3x3s2", "NHWC", dtype)
    x, w, dy = (jnp.asarray(a, dtype) for a in case_inputs(spec, seed=4))
    preferred = jnp.float32 if dtype == "bfloat16" else None
    hybrid = jax.jit(train_fn(spec, HYBRID, preferred))
    compiled = hybrid.lower(x, w, dy).compile().as_text()
    want = [onednn_load.TARGETS["bwd_data"], onednn_load.TARGETS["fwd"]]
    assert _targets(compiled) == sorted(want) and "convolution" in compiled
    # The same oneDNN calls on the same operands as ``onednn``'s: the same bits.
    got = hybrid(x, w, dy)
    full = jax.jit(train_fn(spec, "onednn", preferred))(x, w, dy)
    for a, b in zip(got[:2], full[:2], strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_off_cpu_and_without_the_extension_it_runs_xla(monkeypatch):
    spec = case_spec("3x3s1", "NHWC")
    x, w, _ = (jnp.asarray(a) for a in case_inputs(spec, seed=7))
    loss = lambda a, b: jnp.sum(conv_fn(spec, HYBRID)(a, b))  # noqa: E731
    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    gpu = grad.trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
    assert onednn.TARGET_PREFIX not in gpu and "convolution" in gpu
    simulate_no_onednn(monkeypatch)
    chosen = ca.select_algorithm(spec, HYBRID)
    assert chosen.name == "xla" and "simulated" in chosen.reason
    assert onednn.TARGET_PREFIX not in jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, w).as_text()
