"""A float32 kernel beside bfloat16 activations (a ``mixed_bf16`` layer's parameter) goes into
oneDNN's forward and input-gradient calls as it is, rounded by their weight reorder
(``Algorithm.rounds_kernel``), instead of through an XLA convert in front of each call.

Reference: the same conv on the kernel converted to bfloat16 by XLA. Rounding to bfloat16 has
one right answer (round to nearest, ties to even), so the results must match bit for bit:
forward, input gradient, and the weight gradient once rounded to the bfloat16 kernel's dtype.
The kernels hold exact ties (the low 16 bits 0x8000, odd and even halves), where rounding
half up or truncating would differ from XLA's convert.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from onednn_helpers import (
    FAST_COMPILE,
    case_inputs,
    case_spec,
    needs_onednn,
    simulate_no_onednn,
    train_fn,
)

from layoutlab.nn import conv_algos as ca
from layoutlab.nn.conv_algos import onednn
from layoutlab.xla.hlo import hlo_report

# A strided 3x3, the RGB stem (its bfloat16 weight gradient runs the float32 primitive) and a
# batch-8 strided conv (oneDNN's own bfloat16 weight-gradient kernel): each forward reorders.
CASES = ("3x3s2", "7x7s2_rgb", "3x3s2_batch8")


def _with_ties(w: np.ndarray) -> np.ndarray:
    """``w`` (float32) with every third value moved to a tie between two bfloat16 values."""
    bits = w.astype(np.float32).view(np.uint32).copy()
    flat = bits.reshape(-1)
    flat[::3] = (flat[::3] & np.uint32(0xFFFF0000)) | np.uint32(0x8000)
    return bits.view(np.float32)


def _inputs(spec, seed):
    x, w, dy = case_inputs(spec, seed=seed)
    w = _with_ties(np.asarray(w, np.float32))
    assert np.any(w.view(np.uint32) & 0xFFFF == 0x8000)
    return jnp.asarray(x, jnp.bfloat16), jnp.asarray(w), jnp.asarray(dy, jnp.bfloat16)


def _bits_equal(a, b) -> bool:
    return a.dtype == b.dtype and np.array_equal(np.asarray(a).view(np.uint16),
                                                 np.asarray(b).view(np.uint16))  # fmt: skip


@needs_onednn
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_a_float32_kernel_gives_the_bits_of_its_bfloat16_convert(layout):
    for i, case in enumerate(CASES):
        spec = case_spec(case, layout, "bfloat16")
        x, w32, dy = _inputs(spec, seed=11 + i)
        # Both sides are this program at LLVM level 0 (docs/development.md): the bits compared
        # are oneDNN's and the converts', which the backend's optimization level does not touch.
        train = jax.jit(train_fn(spec, "onednn", jnp.float32), compiler_options=FAST_COMPILE)
        y, dx, dw = train(x, w32, dy)
        y_c, dx_c, dw_c = train(x, w32.astype(jnp.bfloat16), dy)
        assert _bits_equal(y, y_c) and _bits_equal(dx, dx_c), case
        # The float32 kernel's gradient comes back in float32: the bfloat16 kernel's is the
        # same float32 sum rounded once.
        assert dw.dtype == jnp.float32 and _bits_equal(dw.astype(jnp.bfloat16), dw_c), case


@needs_onednn
def test_the_program_hands_the_float32_kernel_to_the_calls_without_a_convert():
    spec = case_spec("3x3s1", "NHWC", "bfloat16")
    x, w32, dy = _inputs(spec, seed=3)
    text = jax.jit(train_fn(spec, "onednn", jnp.float32)).lower(x, w32, dy).compile().as_text()
    report = hlo_report(text)
    kernels = {
        c.target.rsplit("_", 1)[-1]: c.operands[1].dtype
        for c in report.custom_calls
        if c.target.startswith(onednn.TARGET_PREFIX) and not c.target.endswith("weights")
    }
    assert kernels == {"fwd": "f32", "data": "f32"}, kernels
    # The weight gradient writes float32 itself: no convert touches a kernel-shaped tensor.
    shape = tuple(w32.shape)
    converts = [line for line in text.splitlines() if " convert(" in line and
                f"[{','.join(map(str, shape))}]" in line]  # fmt: skip
    assert converts == []


@needs_onednn
def test_a_mixed_bf16_layer_keeps_its_bits_with_the_kernel_rounded_by_onednn():
    """The layer hands its float32 parameter to ``conv2d``; with ``rounds_kernel`` taken
    away from the algorithm's value the kernel is converted by XLA first, as before. Both
    must give the same output and the same float32 gradients, bit for bit."""
    from flax import nnx

    from layoutlab import nn
    from layoutlab.precision import get_policy

    x = jax.random.normal(jax.random.key(0), (4, 8, 8, 16), jnp.float32)
    value = ca.get_algorithm("onednn")
    outs = []
    for algorithm in (value, value._replace(rounds_kernel=False)):
        conv = nn.Conv(16, 32, 3, strides=2, use_bias=False,
                       policy=get_policy("mixed_bf16"), rngs=nnx.Rngs(1))  # fmt: skip
        conv = nn.configure(conv, nn.ConvSettings(algorithm=algorithm))

        graph = nnx.graphdef(conv)

        @jax.jit
        def loss(params, x, graph=graph):
            y = nnx.merge(graph, params)(x)
            return jnp.sum(y.astype(jnp.float32) ** 2), y

        (_, y), grads = jax.value_and_grad(loss, has_aux=True)(nnx.state(conv), x)
        outs.append((y, *jax.tree.leaves(grads)))
    for a, b in zip(*outs, strict=True):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
    assert outs[0][1].dtype == jnp.float32


@needs_onednn
def test_the_handler_refuses_a_kernel_it_cannot_round():
    """float32 activations with a bfloat16 kernel: the one mixed pairing the primitives do
    not take (the registry core casts it instead); called directly, the handler says why."""
    spec = case_spec("3x3s1", "NHWC")
    x, w, _ = (jnp.asarray(a) for a in case_inputs(spec, seed=5))
    with pytest.raises(Exception, match="kernel is its activations' dtype, or float32"):
        jax.block_until_ready(onednn.onednn_conv(x, w.astype(jnp.bfloat16), spec.geometry, None))
    y = onednn.onednn_core(x, w.astype(jnp.bfloat16), spec.geometry, None)
    assert y.dtype == jnp.float32


def test_without_the_extension_or_off_cpu_the_kernel_is_converted_for_xla(monkeypatch):
    spec = case_spec("3x3s2", "NHWC", "bfloat16")
    x, w32, dy = _inputs(spec, seed=8)
    f = train_fn(spec, "onednn", jnp.float32)
    gpu = jax.jit(f).trace(x, w32, dy).lower(lowering_platforms=("cuda",)).as_text()
    assert onednn.TARGET_PREFIX not in gpu and "convolution" in gpu
    simulate_no_onednn(monkeypatch)
    # A new function: jit would reuse the trace above, made with the extension present.
    y, dx, dw = jax.jit(train_fn(spec, "onednn", jnp.float32))(x, w32, dy)
    # XLA's conv, given the same float32 kernel, which conv2d converts in front of it.
    want = jax.jit(train_fn(spec, "xla", jnp.float32))(x, w32, dy)
    for a, b in zip((y, dx, dw), want, strict=True):
        assert _bits_equal(a, b)
    assert dw.dtype == jnp.float32
