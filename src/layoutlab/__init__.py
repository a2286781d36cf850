"""layoutlab: Flax vision models written once, run in NHWC or NCHW, in any precision."""

from layoutlab.layout import Layout, channels_first, channels_last, parse_layout, to_layout
from layoutlab.precision import Policy, get_policy

__version__ = "0.1.0"

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


def __getattr__(name):
    # convert_layout lives in nn/, which imports flax; keep `import layoutlab` light.
    if name == "convert_layout":
        from layoutlab.nn.convert import convert_layout

        return convert_layout
    if name == "load_model":  # a trained run's model; imports JAX, flax and orbax
        from layoutlab.infer.load import load_model

        return load_model
    raise AttributeError(f"module 'layoutlab' has no attribute {name!r}")
