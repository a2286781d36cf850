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

from layoutlab.layout import Layout, to_layout

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
    """Base of the architectures: ``model(x)`` checks ``x`` then runs ``forward(x)``.

    ``layout`` is the layout of the inputs (and of a spatial output); ``compute_layout`` the
    one the layers are built with and run in (``models.create``'s ``activation_storage``
    chooses it; ``nn.configure`` moves a copy): when they differ, ``x`` is transposed into
    it before ``forward`` and a spatial output back out of it after. A builder calls
    ``_set_layouts`` first and builds its layers in the layout it returns.
    """

    layout: Layout
    compute_layout: Layout

    def _set_layouts(self, layout: Layout, compute_layout: Layout | None) -> Layout:
        """Record ``layout`` and ``compute_layout`` (None: ``layout``); the latter."""
        self.layout = layout
        inner = layout if compute_layout is None else compute_layout
        if not isinstance(inner, Layout) or inner.rank != layout.rank:
            raise ValueError(
                f"{type(self).__name__}: compute_layout must be a Layout of the same rank as "
                f"layout {layout.value}, got {compute_layout!r}."
            )
        self.compute_layout = inner
        return inner

    def __call__(self, x):
        x = check_model_input(x, self.layout, type(self).__name__)
        inner = self.compute_layout
        if inner == self.layout:
            return self.forward(x)
        y = self.forward(to_layout(x, self.layout, inner))
        return to_layout(y, inner, self.layout) if y.ndim == self.layout.rank else y

    def forward(self, x):
        raise NotImplementedError(f"{type(self).__name__} must define forward(x).")
