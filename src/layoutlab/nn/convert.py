"""``convert_layout``: the same model, weights moved to the other layout; and
``set_activation_storage``: the same model and interface, computing channels-last inside."""

from __future__ import annotations

from flax import nnx

from layoutlab.layout import Layout, channels_first, channels_last, parse_layout
from layoutlab.nn.base import LayoutModule
from layoutlab.nn.conv_names import ACTIVATION_STORAGES

__all__ = [
    "activation_storage",
    "check_activation_storage",
    "convert_layout",
    "in_own_layout",
    "set_activation_storage",
]


def _target(dst: Layout, rank: int) -> Layout:
    # "NCHW" asked of a 3D model means its channels-first layout, NCDHW.
    n = rank - 2
    return channels_last(n) if dst.is_channels_last else channels_first(n)


def _move_layers(model: nnx.Module, dst: Layout, *, skip=None) -> bool:
    """Move every layer (and every module with a ``layout``) of ``model`` to ``dst``'s
    family, converting layout-dependent params; whether it found a ``layoutlab.nn`` layer."""
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
    computes in ``layout`` itself (a ``set_activation_storage`` setting is not carried over).
    """
    dst = parse_layout(layout)
    new = nnx.clone(model)
    if not _move_layers(new, dst):
        raise ValueError(
            f"{type(model).__name__} has no layoutlab.nn layers; convert_layout only "
            "converts models built from layoutlab.nn."
        )
    if getattr(new, "compute_layout", None) is not None:
        new.compute_layout = None
    return new


def check_activation_storage(storage: str) -> str:
    if storage not in ACTIVATION_STORAGES:
        raise ValueError(
            f"Unknown activation_storage {storage!r}; use 'layout' (compute in the model's "
            "layout) or 'channels_last' (compute channels-last inside, inputs and outputs "
            "keep the model's layout)."
        )
    return storage


def set_activation_storage(model: nnx.Module, storage: str) -> nnx.Module:
    """Set where ``model`` computes, in place; returns ``model``.

    ``"channels_last"``: a channels-first model (NCHW) still takes and returns arrays in its
    layout, but its layers run channels-last (NHWC), with one transpose of the input and of
    a spatial output; PyTorch's ``channels_last`` memory format, which XLA:CPU's convs
    prefer. ``"layout"``: the layers run in the model's own layout. A channels-last model is
    the same under both. ``Conv`` params keep their shapes when the convs store kernels
    ``"channels_last"`` (``set_kernel_storage``); with ``"layout"`` storage, and in
    ``ConvTranspose``, the kernels follow the layers' layout. ``model`` must be a registry
    model (``models.ImageModel``).
    """
    check_activation_storage(storage)
    layout = getattr(model, "layout", None)
    if not isinstance(layout, Layout) or not hasattr(model, "compute_layout"):
        raise ValueError(
            f"{type(model).__name__} is not a layoutlab.models model (ImageModel); only those "
            "can compute in another layout than their inputs'."
        )
    inner = layout if storage == "layout" else channels_last(layout.num_spatial)
    _move_layers(model, inner, skip=model)
    model.compute_layout = None if inner == layout else inner
    return model


def in_own_layout(model: nnx.Module) -> nnx.Module:
    """``model`` if its layers run in its own layout, else a copy whose layers do (same
    weights): what a layer-by-layer reference expects, each layer's output in the model's
    layout."""
    if getattr(model, "compute_layout", None) is None:
        return model
    return set_activation_storage(nnx.clone(model), "layout")


def activation_storage(model: nnx.Module) -> str:
    """``"channels_last"`` if ``model`` computes channels-last inside another layout, else
    ``"layout"``."""
    return "layout" if getattr(model, "compute_layout", None) is None else "channels_last"
