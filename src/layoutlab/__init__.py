"""layoutlab: Flax vision models written once, run in NHWC or NCHW, in any precision.

Names load lazily (``layoutlab.lazy``): ``import layoutlab`` and the ``layoutlab`` command's
``--help`` import no JAX; ``layoutlab.Layout`` and the others import what they need.
"""

from typing import TYPE_CHECKING

from layoutlab.lazy import lazy_exports
from layoutlab.version import __version__ as __version__

if TYPE_CHECKING:
    from layoutlab.infer.load import load_model
    from layoutlab.layout import Layout, channels_first, channels_last, parse_layout, to_layout
    from layoutlab.nn.convert import convert_layout
    from layoutlab.precision import Policy, get_policy

_EXPORTS = {
    "Layout": "layout",
    "channels_first": "layout",
    "channels_last": "layout",
    "parse_layout": "layout",
    "to_layout": "layout",
    "Policy": "precision",
    "get_policy": "precision",
    "convert_layout": "nn.convert",
    # A trained run's model; imports JAX, flax and orbax.
    "load_model": "infer.load",
}

__all__ = [
    "Layout",
    "Policy",
    "channels_first",
    "channels_last",
    "convert_layout",
    "get_policy",
    "load_model",
    "parse_layout",
    "to_layout",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, lambda: set(globals()))
