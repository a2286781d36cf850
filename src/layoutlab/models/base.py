"""``ImageModel``: what every registered architecture checks of its input, once, up front.

A model's first layer would otherwise meet a Python list (``AttributeError``), an unbatched
image (a rank error from a conv, or an ``IndexError``) or an empty batch (a
``ZeroDivisionError`` in a reshape, or, in training mode, BatchNorm statistics averaged over
nothing: NaN stored in its running mean and variance). Subclasses define ``forward``.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from layoutlab.layout import Layout

__all__ = ["ImageModel", "check_model_input"]


def check_model_input(x, layout: Layout, where: str):
    """``x`` if it is a non-empty array of ``layout``'s rank, else a ``ValueError`` naming
    the problem and the fix."""
    axes = f"({', '.join(layout.value)})"
    expected = f"{where} expects a {layout.rank}-D array {axes} for layout {layout.value}"
    if not isinstance(x, (jax.Array, np.ndarray)):
        raise ValueError(
            f"{expected}, got a {type(x).__name__}; convert it first, e.g. jnp.asarray(x)."
        )
    if x.ndim != layout.rank:
        fix = (
            "add the batch axis, e.g. x[None]"
            if x.ndim == layout.rank - 1
            else f"reshape it to {axes}"
        )
        raise ValueError(f"{expected}, got shape {tuple(x.shape)}; {fix}.")
    if x.shape[0] == 0:
        raise ValueError(
            f"{where} got an empty batch, shape {tuple(x.shape)}: pass at least one example "
            "(BatchNorm would average over nothing and store NaN statistics)."
        )
    return x


class ImageModel(nnx.Module):
    """Base of the architectures: ``model(x)`` checks ``x`` then runs ``forward(x)``."""

    layout: Layout

    def __call__(self, x):
        return self.forward(check_model_input(x, self.layout, type(self).__name__))

    def forward(self, x):
        raise NotImplementedError(f"{type(self).__name__} must define forward(x).")
