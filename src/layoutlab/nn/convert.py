"""``convert_layout``: the same model, weights moved to the other layout; and where a model
computes (its ``compute_layout``, named by ``activation_storage``; ``nn.configure`` moves a
copy)."""

from __future__ import annotations

from flax import nnx

from layoutlab.layout import Layout, channels_first, channels_last, parse_layout
from layoutlab.nn.base import LayoutModule
from layoutlab.nn.conv_names import ACTIVATION_STORAGES

__all__ = ["activation_storage", "check_activation_storage", "convert_layout", "move_layers"]


def _target(dst: Layout, rank: int) -> Layout:
    # "NCHW" asked of a 3D model means its channels-first layout, NCDHW.
    n = rank - 2
    return channels_last(n) if dst.is_channels_last else channels_first(n)


def move_layers(model: nnx.Module, dst: Layout, *, skip=None) -> bool:
    """Move every layer (and every module with a ``layout``) of ``model`` to ``dst``'s
    family in place, converting layout-dependent params; whether it found a
    ``layoutlab.nn`` layer. For a copy the caller made (``convert_layout``, ``configure``)."""
    found = False
    for _, node in nnx.iter_graph(model):
        if node is skip:
            continue
        if isinstance(node, LayoutModule):
            node._to_layout(_target(dst, node.layout.rank))
            found = True
        elif isinstance(node, nnx.Module) and isinstance(getattr(node, "layout", None), Layout):
            node.layout = _target(dst, node.layout.rank)
    return found


def convert_layout(model: nnx.Module, layout: Layout | str) -> nnx.Module:
    """Return a copy of ``model`` running in ``layout`` with its weights converted.

    Outputs equal the original's up to a layout transpose. Only modules built from
    ``layoutlab.nn`` layers are converted; the original model is left untouched. The copy
    computes in ``layout`` itself (an ``activation_storage`` setting is not carried over).
    """
    dst = parse_layout(layout)
    new = nnx.clone(model)
    if not move_layers(new, dst):
        raise ValueError(
            f"{type(model).__name__} has no layoutlab.nn layers; convert_layout only "
            "converts models built from layoutlab.nn."
        )
    if getattr(new, "compute_layout", None) is not None:
        new.compute_layout = new.layout
    return new


def check_activation_storage(storage: str) -> str:
    if storage not in ACTIVATION_STORAGES:
        raise ValueError(
            f"Unknown activation_storage {storage!r}; use 'layout' (compute in the model's "
            "layout) or 'channels_last' (compute channels-last inside, inputs and outputs "
            "keep the model's layout)."
        )
    return storage


def activation_storage(model: nnx.Module) -> str:
    """``"channels_last"`` if ``model`` computes channels-last inside another layout, else
    ``"layout"``."""
    inner = getattr(model, "compute_layout", None)
    return "layout" if inner in (None, getattr(model, "layout", None)) else "channels_last"
