"""Activations as parameter-free modules, so a layer list lines up with torchvision's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = ["ReLU", "ReLU6"]


class ReLU(nnx.Module):
    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.nn.relu(x)


class ReLU6(nnx.Module):
    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.clip(x, jnp.array(0, x.dtype), jnp.array(6, x.dtype))
