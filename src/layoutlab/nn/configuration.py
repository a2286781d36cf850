"""``configure(model, settings)``: a copy of ``model`` whose convs run ``settings``.

The one way to change how a model's convs compute, like equinox's ``tree_at``: it returns a
new model and never changes the one it is given. A conv's settings are one frozen value
(``ConvSettings``), a static attribute, so a jitted model retraces exactly when they change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from flax import nnx

from layoutlab.layout import Layout, channels_last
from layoutlab.nn.conv import Conv
from layoutlab.nn.conv_algos.algorithm import Algorithm
from layoutlab.nn.conv_algos.plan import ConvPlan
from layoutlab.nn.conv_config import check_plan_fits, convs
from layoutlab.nn.conv_settings import ConvSettings
from layoutlab.nn.convert import check_activation_storage, move_layers
from layoutlab.nn.norm import BatchNorm, check_batch_norm_impl
from layoutlab.nn.pooling import MaxPool, check_max_pool_impl

__all__ = ["configure", "in_own_layout", "without_custom_calls"]

M = TypeVar("M", bound=nnx.Module)
Settings = ConvSettings | Mapping[str, ConvSettings] | ConvPlan | None


def configure(
    model: M,
    settings: Settings = None,
    *,
    algorithms: Mapping[str, Algorithm] | None = None,
    activation_storage: str | None = None,
    batch_norm: str | None = None,
    max_pool: str | None = None,
) -> M:
    """A copy of ``model`` with new conv settings; ``model`` is not changed.

    ``settings``:

    - a ``ConvSettings``: every ``Conv`` runs it (a 1D or 3D conv, XLA's conv in its kernel
      storage); an algorithm other than ``"xla"``/``"auto"`` on a model without convs raises;
    - ``{path: ConvSettings}`` (paths as ``conv_config.convs`` names them): those convs;
    - a ``ConvPlan``: every 2D conv runs ``"auto"`` with its entry (none: XLA's conv), each
      entry's algorithm value taken from ``algorithms`` (a ``train.spec.RunSpec``'s; the
      table of names is not read), its kernel storage kept. A plan naming a conv the model
      does not have raises ``ConvPlanMismatch`` (it was made for another model);
    - None: the convs keep theirs.

    ``activation_storage`` (a ``models.ImageModel``'s, whose ``compute_layout`` it sets):
    ``"channels_last"`` computes a channels-first model channels-last inside, its inputs and
    outputs keeping its layout (PyTorch's ``channels_last`` memory format, which XLA:CPU's
    convs prefer); ``"layout"`` in its own layout. It applies first, so the convs' settings
    see the layout they compute in. The settings are static attributes: the copy's graph
    definition, and with it ``jax.jit``'s cache key, differs from ``model``'s exactly where
    the settings do.

    ``batch_norm`` (one of ``nn.norm.BATCH_NORM_IMPLS``): how every ``BatchNorm`` computes in
    training mode, ``"xla"`` for XLA's ops (a run whose batch is split over devices, whose
    statistics need XLA's cross-device reduction), ``"auto"`` for oneDNN's primitive where it
    applies; None: they keep theirs.

    ``max_pool`` (one of ``nn.pooling.MAX_POOL_IMPLS``): how every ``MaxPool`` computes,
    ``"xla"`` for XLA's ops (a run whose batch is split over devices: XLA's partitioner
    cannot split a oneDNN call, it would gather the batch), ``"auto"`` for oneDNN's primitive
    where it applies; None: they keep theirs.
    """
    per_conv = _per_conv(model, settings, algorithms)
    if batch_norm is not None:
        check_batch_norm_impl(batch_norm)
    if max_pool is not None:
        check_max_pool_impl(max_pool)
    copy = nnx.clone(model)
    if activation_storage is not None:
        _compute_in(copy, activation_storage)
    # One walk of the graph sets every layer kind's implementation that was asked for.
    impls = [(cls, impl) for cls, impl in ((BatchNorm, batch_norm), (MaxPool, max_pool)) if impl]
    if impls:
        for _, layer in nnx.iter_graph(copy):
            for cls, impl in impls:
                if isinstance(layer, cls):
                    layer.impl = impl
    found = dict(convs(copy))
    for path, conv_settings in per_conv.items():
        found[path]._set_settings(_for_rank(conv_settings, found[path]))
    return copy


def _per_conv(model: nnx.Module, settings: Settings, algorithms) -> dict[str, ConvSettings]:
    found = dict(convs(model))
    if settings is None:
        return {}
    if isinstance(settings, ConvSettings):
        if not found and settings.name not in ("xla", "auto"):
            raise ValueError(
                f"{type(model).__name__} has no layoutlab.nn.Conv layers to run {settings.name!r}."
            )
        return dict.fromkeys(found, settings)
    if isinstance(settings, ConvPlan):
        check_plan_fits(model, settings)
        return {
            path: ConvSettings.planned(
                settings.get(path), algorithms or {}, kernel_storage=conv.kernel_storage
            )
            for path, conv in found.items()
        }
    if isinstance(settings, Mapping):
        unknown = sorted(set(settings) - set(found))
        if unknown:
            raise ValueError(
                f"{type(model).__name__} has no Conv at {', '.join(map(repr, unknown))}; "
                "name convs by their paths (nn.conv_config.convs(model))."
            )
        return dict(settings)
    raise TypeError(
        "nn.configure takes a ConvSettings, {path: ConvSettings}, a ConvPlan or None, got "
        f"{type(settings).__name__} (a plan's dict: ConvPlan.from_dict(d))."
    )


def _for_rank(settings: ConvSettings, conv: Conv) -> ConvSettings:
    # Model-wide settings leave 1D and 3D convs on XLA's conv (only 2D convs run algorithms).
    if conv.layout.num_spatial == 2 or settings.name == "xla":
        return settings
    return ConvSettings(kernel_storage=settings.kernel_storage)


def _compute_in(model: nnx.Module, storage: str) -> None:
    # In place, on the copy configure made.
    check_activation_storage(storage)
    layout = getattr(model, "layout", None)
    if not isinstance(layout, Layout) or not hasattr(model, "compute_layout"):
        raise ValueError(
            f"{type(model).__name__} is not a layoutlab.models model (ImageModel); only those "
            "can compute in another layout than their inputs' (activation_storage)."
        )
    inner = layout if storage == "layout" else channels_last(layout.num_spatial)
    move_layers(model, inner, skip=model)
    model.compute_layout = inner


def in_own_layout(model: M) -> M:
    """``model`` if its layers run in its own layout, else a copy whose layers do (same
    weights): what a layer-by-layer reference expects, each layer's output in the model's
    layout."""
    if getattr(model, "compute_layout", None) in (None, getattr(model, "layout", None)):
        return model
    return configure(model, activation_storage="layout")


def without_custom_calls(model: M) -> M:
    """``model`` itself when no conv runs an algorithm whose core makes custom calls
    (``Algorithm.custom_calls``) and no ``BatchNorm`` or ``MaxPool`` may run oneDNN's
    (``may_call_onednn``), else a copy whose such convs run ``xla`` and whose batch norms and
    max pools run XLA's ops: a program of
    the copy holds only XLA's own ops, so it runs where layoutlab's kernels are not registered
    (an exported artifact). Only the graph definition changes; the weights fit both."""
    native = {
        path: conv.settings.native()
        for path, conv in convs(model)
        if conv.settings.algorithm is not None and conv.settings.algorithm.custom_calls
    }
    onednn_layers = [
        layer
        for _, layer in nnx.iter_graph(model)
        if isinstance(layer, (BatchNorm, MaxPool)) and layer.may_call_onednn()
    ]
    norms = any(isinstance(layer, BatchNorm) for layer in onednn_layers)
    pools = any(isinstance(layer, MaxPool) for layer in onednn_layers)
    if not native and not norms and not pools:
        return model
    return configure(
        model,
        native or None,
        batch_norm="xla" if norms else None,
        max_pool="xla" if pools else None,
    )
