"""Model-wide conv settings: the algorithm every 2D ``Conv`` uses and how kernels are stored.

Both are static attributes of the ``Conv`` layers, so a jitted model retraces after a
change (nnx's graph definition changes) and never runs a stale trace.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from layoutlab.nn.conv import Conv, check_kernel_storage
from layoutlab.nn.conv_algos.choices import force_conv_algorithm, get_choice
from layoutlab.nn.conv_algos.dispatch import record_conv_specs
from layoutlab.nn.conv_algos.geometry import ConvSpec
from layoutlab.nn.conv_algos.registry import XLA, check_name


def convs(model: nnx.Module) -> list[tuple[str, Conv]]:
    """``(path, conv)`` of every ``Conv`` in ``model``."""
    out = []
    for path, node in nnx.iter_graph(model):
        if isinstance(node, Conv):
            out.append(("/".join(str(p) for p in path), node))
    return out


def _require_convs(model: nnx.Module, what: str) -> list[tuple[str, Conv]]:
    found = convs(model)
    if not found:
        raise ValueError(f"{type(model).__name__} has no layoutlab.nn.Conv layers to {what}.")
    return found


def set_conv_algorithm(model: nnx.Module, algorithm: str) -> nnx.Module:
    """Set ``algorithm`` on every 2D ``Conv`` of ``model`` in place (others stay ``xla``);
    returns ``model``. ``"auto"`` reads the choice table at trace time."""
    check_name(algorithm)
    for _, conv in _require_convs(model, "set an algorithm on"):
        conv.algorithm = algorithm if conv.layout.num_spatial == 2 else XLA
    return model


def set_kernel_storage(model: nnx.Module, storage: str) -> nnx.Module:
    """Move every ``Conv`` kernel to ``storage`` in place (``"layout"``/``"channels_last"``).

    ``"channels_last"`` removes the per-call kernel transpose of channels-first models on
    XLA:CPU. Do it after importing weights (torch import and ``convert_layout`` expect
    ``"layout"`` storage) and before saving checkpoints others will read.
    """
    for _, conv in _require_convs(model, "store kernels of"):
        conv.set_kernel_storage(storage)
    return model


def check_conv_options(algorithm: str | None = None, kernel_storage: str | None = None) -> None:
    """Raise ``ValueError`` naming the fix for an unknown algorithm or kernel storage, before
    any model is built (``None``: not given)."""
    if algorithm is not None:
        check_name(algorithm)
    if kernel_storage is not None:
        check_kernel_storage(kernel_storage)


def configure_convs(
    model: nnx.Module, algorithm: str | None = None, kernel_storage: str | None = None
) -> nnx.Module:
    """``set_conv_algorithm`` and ``set_kernel_storage`` in one call; ``None`` leaves that
    setting alone, and a model without ``Conv`` layers is fine when both are defaults
    (``"xla"`` / ``"layout"``), so callers can pass their options through unconditionally."""
    if algorithm is not None and (algorithm != XLA or convs(model)):
        set_conv_algorithm(model, algorithm)
    if kernel_storage is not None and (kernel_storage != "layout" or convs(model)):
        set_kernel_storage(model, kernel_storage)
    return model


def conv_settings(model: nnx.Module) -> dict[str, tuple[str, str]]:
    """``{path: (algorithm, kernel_spec)}`` for every ``Conv``."""
    return {path: (c.algorithm, c.kernel_spec) for path, c in convs(model)}


def model_conv_specs(model: nnx.Module, x) -> list[ConvSpec]:
    """The distinct 2D conv specs ``model(x)`` runs (``x``: array or ShapeDtypeStruct),
    in call order; traced abstractly, nothing is computed and ``model`` is not changed."""
    graphdef, state = nnx.split(model)
    x = jax.ShapeDtypeStruct(np.shape(x), x.dtype)

    def run(st, inp):
        return nnx.merge(graphdef, st, copy=True)(inp)

    with record_conv_specs() as specs, force_conv_algorithm(XLA):
        jax.eval_shape(run, state, x)
    unique = {s.key(): s for s in specs}
    if not unique:
        raise ValueError(
            f"{type(model).__name__} runs no 2D layoutlab.nn.Conv on input {x.shape}; "
            "nothing to autotune."
        )
    return list(unique.values())


def missing_choices(model: nnx.Module, x) -> list[ConvSpec]:
    """Conv specs of ``model(x)`` with no entry in the ``"auto"`` table (they run ``xla``)."""
    return [s for s in model_conv_specs(model, x) if get_choice(s.key()) is None]
