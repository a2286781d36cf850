"""A half-precision conv is written for the backend it compiles for
(``nn.conv_algos.native.xla_conv``): on the CPU, half operands with a float32 result; on a
GPU, half operands and a half result, which XLA:GPU runs on cuDNN's half kernels instead of
widening both operands to float32.

``jax.export`` lowers for a platform this machine lacks, so both programs are read here
without a GPU: every ``stablehlo.convolution`` of a layer's forward pass and gradients, its
operand and result dtypes. What XLA:GPU then runs is the GPU-marked test in
``test_xla_inspect.py``.
"""

import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax import export

from layoutlab import nn
from layoutlab.layout import Layout
from layoutlab.precision import get_policy

# `stablehlo.convolution(%a, %b) ... : (tensor<2x8x8x4xbf16>, tensor<...>) -> tensor<...>`
_TENSOR = r"tensor<[^>]*x(\w+)>"
_CONV = re.compile(rf"stablehlo\.convolution\(.*: \({_TENSOR}, {_TENSOR}\) -> {_TENSOR}")
_HALF = {"mixed_bf16": "bf16", "mixed_fp16": "f16"}


def _layers(name):
    rngs, policy = nnx.Rngs(0), get_policy(name)
    return {
        "conv 3x3, auto": (
            nn.Conv(4, 8, 3, algorithm="auto", policy=policy, rngs=rngs),
            (2, 8, 8, 4),
        ),
        "conv 3x3 stride 2, xla": (
            nn.Conv(4, 8, 3, strides=2, algorithm="xla", policy=policy, rngs=rngs),
            (2, 8, 8, 4),
        ),
        "depthwise": (nn.Conv(8, 8, 3, groups=8, policy=policy, rngs=rngs), (2, 8, 8, 8)),
        "transposed, overlapping taps": (
            nn.ConvTranspose(4, 8, 3, strides=2, padding=1, policy=policy, rngs=rngs),
            (2, 5, 5, 4),
        ),
        "3d": (nn.Conv(4, 8, 3, layout=Layout.NDHWC, policy=policy, rngs=rngs), (2, 4, 4, 4, 4)),
    }


def _convs(layer, shape, platform):
    """(lhs, rhs, result) dtypes of each conv in the program of ``layer``'s loss and its
    gradients with respect to the parameters and the input, lowered for ``platform``."""
    graphdef, params = nnx.split(layer)

    def loss(params, x):
        return jnp.sum(nnx.merge(graphdef, params)(x).astype(jnp.float32))

    fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    x = jnp.ones(shape, jnp.float32)
    text = export.export(fn, platforms=(platform,))(params, x).mlir_module()
    return _CONV.findall(text), text


@pytest.mark.parametrize("policy", sorted(_HALF))
def test_gpu_program_runs_every_conv_in_half(policy):
    half = _HALF[policy]
    for name, (layer, shape) in _layers(policy).items():
        convs, _ = _convs(layer, shape, "cuda")
        # The forward conv and both gradients' (a transposed conv's gradient may be one).
        assert len(convs) >= 2, (name, convs)
        assert all(c == (half, half, half) for c in convs), (name, convs)


@pytest.mark.parametrize("policy", sorted(_HALF))
def test_cpu_program_keeps_the_float32_result(policy):
    half = _HALF[policy]
    for name, (layer, shape) in _layers(policy).items():
        convs, _ = _convs(layer, shape, "cpu")
        assert (half, half, "f32") in convs, (name, convs)
        assert all(c[2] == "f32" for c in convs), (name, convs)


def test_float32_convs_are_written_once_for_every_backend():
    # No platform branch at all when nothing is half: the program is the plain conv.
    for name, (layer, shape) in _layers("fp32").items():
        for platform in ("cpu", "cuda"):
            convs, text = _convs(layer, shape, platform)
            assert convs and all(c == ("f32", "f32", "f32") for c in convs), (name, convs)
            assert "stablehlo.case" not in text, (name, platform)
