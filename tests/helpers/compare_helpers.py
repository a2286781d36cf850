"""Test helpers for the comparison tests: registry models with random weights, fast.

``models.create`` draws every weight with ``jax.random``, which compiles one small kernel per
weight shape; on a busy 2-core machine that costs ~25 s for ResNet-50. The comparison tests
only need *some* weights shared by both sides, so they build the model abstractly
(``nnx.eval_shape``, no compile) and fill it from NumPy.
"""

from __future__ import annotations

import math

import jax
import numpy as np
from flax import nnx

from layoutlab import models, nn


def _fill_layer(node, rng: np.random.Generator) -> None:
    def put(var, values):
        if var is not None:
            var.set_value(np.asarray(values, np.float32).astype(var.get_value().dtype))

    if isinstance(node, nn.Conv):  # HWIO: the model is built NHWC
        shape = node.kernel.get_value().shape
        put(node.kernel, rng.normal(0.0, math.sqrt(2.0 / math.prod(shape[:-1])), shape))
        if node.bias is not None:
            put(node.bias, rng.uniform(-0.1, 0.1, node.bias.get_value().shape))
    elif isinstance(node, nn.ConvTranspose | nn.Dense):
        shape = node.kernel.get_value().shape
        # PyTorch's fan-in: Dense (in, out) -> in; ConvTranspose (k..., in, out) -> out * k...
        fan_in = shape[0] if isinstance(node, nn.Dense) else shape[-1] * math.prod(shape[:-2])
        bound = 1.0 / math.sqrt(fan_in)
        put(node.kernel, rng.uniform(-bound, bound, shape))
        if node.bias is not None:
            put(node.bias, rng.uniform(-bound, bound, node.bias.get_value().shape))
    elif isinstance(node, nn.BatchNorm | nn.GroupNorm):
        c = node.num_features
        put(node.scale, rng.uniform(0.5, 1.5, c))
        put(node.bias, rng.normal(0.0, 0.1, c))
        if isinstance(node, nn.BatchNorm):
            put(node.mean, rng.normal(0.0, 0.1, c))
            put(node.var, rng.uniform(0.5, 1.5, c))


def fill_random(model, seed: int = 0) -> None:
    """Give an abstract (``nnx.eval_shape``) model with HWIO kernels NumPy-drawn weights."""
    rng = np.random.default_rng(seed)
    for _, node in nnx.iter_modules(model):
        _fill_layer(node, rng)
    for _, var in nnx.iter_graph(model):
        if isinstance(var, nnx.RngKey):
            var.set_value(jax.random.key(seed))
        elif isinstance(var, nnx.RngCount):
            var.set_value(np.zeros(var.get_value().shape, np.uint32))


def fast_model(name: str, *, layout="NHWC", num_classes=5, policy=None, seed=0, **kw):
    """Registry model ``name`` (tiny options unless overridden) with NumPy-drawn weights;
    the same ``seed`` gives the same weights in every layout."""
    spec = models.spec(name)
    options = {**spec.tiny, **kw}
    model = nnx.eval_shape(
        lambda: models.create(
            name, num_classes=num_classes, layout="NHWC", policy=policy, rngs=nnx.Rngs(0), **options
        )
    )
    fill_random(model, seed)
    if not models.resolve_layout(layout, spec.num_spatial).is_channels_last:
        model = nn.convert_layout(model, layout)
    return model


def random_input(name: str, layout, batch: int, spatial=None, seed=1) -> np.ndarray:
    spec = models.spec(name)
    shape = spec.input_shape(batch, models.resolve_layout(layout, spec.num_spatial), spatial)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def random_layer(factory, *, layout="NHWC", seed=0):
    """A channels-last layer built by ``factory()`` (no weights drawn), given NumPy-drawn
    weights and moved to ``layout``: the same ``seed`` gives the same layer in every layout."""
    layer = nnx.eval_shape(factory)
    rng = np.random.default_rng(seed)
    for _, node in nnx.iter_modules(layer):
        _fill_layer(node, rng)
    if layout in ("NHWC", "NWC", "NDHWC"):
        return layer
    return nn.convert_layout(layer, layout)
