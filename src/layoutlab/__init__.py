"""layoutlab: Flax vision models written once, run in NHWC or NCHW, in any precision.

Names load lazily (``layoutlab.lazy``): ``import layoutlab`` and the ``layoutlab`` command's
``--help`` import no JAX; ``layoutlab.Layout`` and the others import what they need.
"""

from layoutlab.lazy import lazy_exports

__version__ = "0.1.0"

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
