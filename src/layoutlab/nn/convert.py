"""``convert_layout``: the same model, weights moved to the other layout."""

from __future__ import annotations

from flax import nnx

from layoutlab.layout import Layout, channels_first, channels_last, parse_layout
from layoutlab.nn.base import LayoutModule


def _target(dst: Layout, rank: int) -> Layout:
    # "NCHW" asked of a 3D model means its channels-first layout, NCDHW.
    n = rank - 2
    return channels_last(n) if dst.is_channels_last else channels_first(n)


def convert_layout(model: nnx.Module, layout: Layout | str) -> nnx.Module:
    """Return a copy of ``model`` running in ``layout`` with its weights converted.

    Outputs equal the original's up to a layout transpose. Only modules built from
    ``layoutlab.nn`` layers are converted; the original model is left untouched.
    """
    dst = parse_layout(layout)
    new = nnx.clone(model)
    found = False
    for _, node in nnx.iter_graph(new):
        if isinstance(node, LayoutModule):
            node._to_layout(_target(dst, node.layout.rank))
            found = True
        elif isinstance(node, nnx.Module) and isinstance(getattr(node, "layout", None), Layout):
            node.layout = _target(dst, node.layout.rank)
    if not found:
        raise ValueError(
            f"{type(model).__name__} has no layoutlab.nn layers; convert_layout only "
            "converts models built from layoutlab.nn."
        )
    return new
