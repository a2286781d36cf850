"""``Algorithm``: one way to compute a 2D conv, as a value; and ``plain_2d``, the restriction
the custom algorithms share.

An algorithm computes a 2D conv on a channels-last input (``NHWC``) with an ``HWIO`` kernel;
``dispatch.conv2d`` moves other layouts in and out. ``supports(spec)`` returns None when
the algorithm handles ``spec`` and otherwise the reason it does not, and the conv then
falls back to XLA's native convolution. ``dtype_reason(dtype)`` is the part of that which
depends only on the compute dtype (an algorithm whose error exceeds a dtype's bar refuses
it), so a config can be refused before anything is traced (``registry.unsupported_reason``).

The algorithms' modules and ``builtin`` import this module, never the table of names
(``registry``), which imports ``builtin``: the imports run one way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from layoutlab.nn.conv_algos.geometry import ConvSpec, Geometry

__all__ = ["Algorithm", "Core", "DtypeReason", "Supports", "any_dtype", "plain_2d"]

# core(x_nhwc, w_hwio, geometry, preferred_element_type) -> y_nhwc
Core = Callable[..., object]
Supports = Callable[[ConvSpec], "str | None"]
DtypeReason = Callable[[str], "str | None"]


def any_dtype(dtype: str) -> str | None:
    return None


class Algorithm(NamedTuple):
    """``supports`` must refuse every spec whose dtype ``dtype_reason`` refuses.

    ``custom_calls``: the core calls kernels outside XLA (custom calls, e.g. oneDNN's), so a
    program with it runs only where layoutlab registered them; ``layoutlab export`` runs XLA's
    conv in its place (``configuration.without_custom_calls``). ``rounds_once``: with half
    operands the core accumulates in float32 whatever dtype it writes, so asked for the
    half dtype it writes the float32 result rounded once, the bits a float32 output cast
    after it would have, without writing and reading the float32 tensor
    (``dispatch.conv2d``'s ``out_dtype``). ``rounds_kernel``: beside bfloat16 activations the
    core takes a float32 kernel and rounds it itself, as a convert would, where it rewrites the
    kernel anyway (``dispatch.conv2d`` then leaves the layer's float32 parameter uncast, and
    the weight gradient comes back in float32).
    """

    name: str
    core: Core
    supports: Supports
    description: str
    dtype_reason: DtypeReason = any_dtype
    custom_calls: bool = False
    rounds_once: bool = False
    rounds_kernel: bool = False


def plain_2d(spec: ConvSpec) -> str | None:
    """The restriction every custom algorithm shares: ungrouped and undilated."""
    g: Geometry = spec.geometry
    if g.groups != 1:
        return f"groups={g.groups} (grouped and depthwise convs run natively)"
    if g.dilation != (1, 1):
        return f"dilation={g.dilation} (dilated convs run natively)"
    return None
