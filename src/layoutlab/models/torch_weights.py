"""PyTorch ``state_dict`` import and export, in either layout.

Keys are PyTorch module names: torchvision's for ``resnet*``, ``vgg11_bn`` and
``mobilenet_v2`` (``conv1.weight``, ``layer1.0.downsample.0.weight``, ``features.0.0.weight``,
``classifier.1.weight``, ``fc.weight``) and the same rule for the other models, whose torch
mirrors live in ``layoutlab.compare.torch_mirrors``: a layer's key is its path with the
``layers`` list of each ``Sequential`` dropped (``torch_name``). Conversions:

- conv kernels: PyTorch ``OIHW`` <-> the layer's kernel order (``HWIO`` in NHWC models);
- transposed conv kernels: PyTorch ``IOHW`` <-> ``(k..., in, out)`` in NHWC models;
- dense kernels: PyTorch ``(out, in)`` <-> ``(in, out)``;
- BatchNorm: ``weight``/``bias`` <-> ``scale``/``bias``, ``running_mean``/``running_var``
  <-> the ``mean``/``var`` batch stats; ``num_batches_tracked`` is written on export (0)
  and ignored on import;
- flatten order needs nothing: ``Flatten`` flattens in PyTorch's ``C, H, W`` order by default.

torch itself is optional: ``.pth`` files need it, plain dicts of NumPy arrays do not.

This module sits in ``models/`` (built only from ``nn/``) so that ``train --init`` can load
torchvision weights; ``layoutlab.compare.torch_weights`` names the same objects.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from layoutlab.layout import Layout, channels_first, channels_last, convert_kernel
from layoutlab.nn import BatchNorm, Conv, ConvTranspose, Dense, Flatten, GroupNorm

__all__ = [
    "TORCH_MISSING",
    "StateDictKeyError",
    "assign_torch_values",
    "torch_values",
    "StateDictShapeError",
    "require_torch",
    "torch_keys",
    "to_torch_state_dict",
    "load_torch_state_dict",
    "read_state_dict",
    "stored_kernel_layout",
    "torch_name",
    "torch_shapes",
]

TORCH_MISSING = "PyTorch is not installed; install the torch extra: pip install 'layoutlab[torch]'"


def require_torch():
    """Import torch, or raise an ``ImportError`` that says how to install it."""
    try:
        import torch
    except ImportError as err:
        raise ImportError(TORCH_MISSING) from err
    return torch


def torch_name(path: Sequence[Any], nodes: dict[tuple, Any]) -> str:
    """Dotted PyTorch-style name of module ``path``: the ``layers`` list of a Sequential is
    dropped (``nodes``: every module of the model by its path, as ``nnx.iter_modules``)."""
    parts = []
    for i, key in enumerate(path):
        if key == "layers" and isinstance(nodes.get(tuple(path[: i + 1])), nnx.List):
            continue
        parts.append(str(key))
    return ".".join(parts)


class StateDictKeyError(ValueError):
    """The state_dict's keys do not match the model's parameters."""


class StateDictShapeError(ValueError):
    """A state_dict entry has a different shape than the model's parameter."""


@dataclasses.dataclass(frozen=True)
class _Entry:
    key: str  # torch name
    module: Any
    attr: str  # attribute of the module holding the nnx.Variable
    kind: str  # "conv", "conv_transpose", "dense" or "vector"

    @property
    def variable(self) -> nnx.Variable:
        return getattr(self.module, self.attr)

    @property
    def path(self) -> str:
        return self.key.rsplit(".", 1)[0] + "." + self.attr


def _entries(model: nnx.Module) -> list[_Entry]:
    nodes = {tuple(p): n for p, n in nnx.iter_modules(model)}
    entries: list[_Entry] = []
    for path, node in nodes.items():
        name = torch_name(path, nodes)
        prefix = f"{name}." if name else ""

        def add(torch_name: str, attr: str, kind: str, node=node, prefix=prefix) -> None:
            if getattr(node, attr, None) is not None:
                entries.append(_Entry(prefix + torch_name, node, attr, kind))

        if isinstance(node, Conv):
            add("weight", "kernel", "conv")
            add("bias", "bias", "vector")
        elif isinstance(node, ConvTranspose):
            add("weight", "kernel", "conv_transpose")
            add("bias", "bias", "vector")
        elif isinstance(node, Dense):
            add("weight", "kernel", "dense")
            add("bias", "bias", "vector")
        elif isinstance(node, BatchNorm):
            add("weight", "scale", "vector")
            add("bias", "bias", "vector")
            add("running_mean", "mean", "vector")
            add("running_var", "var", "vector")
        elif isinstance(node, GroupNorm):
            add("weight", "scale", "vector")
            add("bias", "bias", "vector")
        elif isinstance(node, Flatten) and node.order != "CHW":
            raise ValueError(
                f"{name}: Flatten(order={node.order!r}) feeds its Dense features in "
                "channels-last order, which PyTorch weights do not use; build the model with "
                "Flatten(order='CHW') to exchange weights with PyTorch."
            )
        else:
            own = [k for k, v in vars(node).items() if isinstance(v, nnx.Param | nnx.BatchStat)]
            if own:
                raise ValueError(
                    f"{name or type(model).__name__}: {type(node).__name__} holds parameters "
                    f"{own} that have no PyTorch counterpart known to layoutlab."
                )
    return entries


def torch_keys(model: nnx.Module) -> list[str]:
    """The ``state_dict`` keys ``model``'s weights map to (``num_batches_tracked`` left out)."""
    return [e.key for e in _entries(model)]


def torch_shapes(model: nnx.Module) -> dict[str, tuple[int, ...]]:
    """``{state_dict key: its shape in PyTorch's order}`` of ``model`` (abstract is fine)."""
    return {e.key: _torch_shape(e) for e in _entries(model)}


def _num_spatial(entry: _Entry) -> int:
    return entry.module.layout.num_spatial


def stored_kernel_layout(conv: Conv) -> Layout:
    """The layout whose kernel order ``conv``'s kernel is stored in (its own layout's, unless
    the conv keeps its kernel channels-last whatever the layout)."""
    n = conv.layout.num_spatial
    spec = getattr(conv, "kernel_spec", conv.layout.kernel_layout)
    return channels_last(n) if spec.endswith("IO") else channels_first(n)


def _to_torch(entry: _Entry, value: np.ndarray) -> np.ndarray:
    if entry.kind == "conv":
        layout = stored_kernel_layout(entry.module)
        return np.asarray(convert_kernel(value, layout, channels_first(layout.num_spatial)))
    if entry.kind == "conv_transpose" and entry.module.layout.is_channels_last:
        n = _num_spatial(entry)  # (k..., I, O) -> (I, O, k...)
        return np.transpose(value, (n, n + 1, *range(n)))
    if entry.kind == "dense":
        return value.T
    return value


def _from_torch(entry: _Entry, value: np.ndarray) -> np.ndarray:
    if entry.kind == "conv":
        layout = stored_kernel_layout(entry.module)
        return np.asarray(convert_kernel(value, channels_first(layout.num_spatial), layout))
    if entry.kind == "conv_transpose" and entry.module.layout.is_channels_last:
        n = _num_spatial(entry)  # (I, O, k...) -> (k..., I, O)
        return np.transpose(value, (*range(2, n + 2), 0, 1))
    if entry.kind == "dense":
        return value.T
    return value


def _torch_shape(entry: _Entry) -> tuple[int, ...]:
    shape = tuple(entry.variable.get_value().shape)
    return _to_torch(entry, np.empty(shape, np.float32)).shape


def _is_bn_counter(key: str) -> bool:
    return key.endswith(".num_batches_tracked") or key == "num_batches_tracked"


def to_torch_state_dict(model: nnx.Module, *, tensors: bool = False) -> dict[str, Any]:
    """``model``'s weights as a PyTorch ``state_dict`` (NumPy arrays, or torch tensors with
    ``tensors=True``). BatchNorm layers also get ``num_batches_tracked = 0``."""
    result: dict[str, Any] = {}
    for entry in _entries(model):
        result[entry.key] = np.ascontiguousarray(
            _to_torch(entry, np.asarray(entry.variable.get_value()))
        )
        if isinstance(entry.module, BatchNorm) and entry.attr == "var":
            result[entry.key.rsplit(".", 1)[0] + ".num_batches_tracked"] = np.array(0, np.int64)
    if tensors:
        torch = require_torch()
        result = {k: _to_tensor(torch, v) for k, v in result.items()}
    return result


def _to_tensor(torch, value: np.ndarray):
    if value.dtype == np.dtype(jnp.bfloat16):
        return torch.from_numpy(value.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.array(value))


def _to_numpy(value: Any, key: str) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu()
        if not value.dtype.is_floating_point or value.element_size() >= 4:
            return value.numpy()
        return value.float().numpy()  # numpy has no bfloat16; float16 goes through too
    if isinstance(value, np.ndarray | np.generic | jax.Array):
        return np.asarray(value)
    raise TypeError(f"state_dict entry {key!r} is a {type(value).__name__}, not a tensor or array.")


def read_state_dict(path: str | os.PathLike) -> dict[str, Any]:
    """Load a ``.pth``/``.pt`` state_dict with ``torch.load(weights_only=True)`` on the CPU."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No PyTorch weights file at {path!r}.")
    torch = require_torch()
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises UnpicklingError, RuntimeError, ...
        raise ValueError(
            f"Could not read {path!r} as a PyTorch state_dict with torch.load(weights_only=True)"
            f": {err}"
        ) from err
    if not isinstance(data, Mapping):
        raise ValueError(f"{path!r} holds a {type(data).__name__}, not a state_dict (a dict).")
    return dict(data)


def _check_mapping(state_dict: Mapping[str, Any]) -> None:
    nested = [k for k, v in state_dict.items() if isinstance(v, Mapping)]
    if nested:
        raise ValueError(
            f"The state_dict holds nested dicts under {nested[:5]}: it looks like a training "
            f"checkpoint; pass its model weights, e.g. checkpoint[{nested[0]!r}]."
        )


def _list(keys: list[str], limit: int = 12) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


def _key_error(model: nnx.Module, missing: list[str], unexpected: list[str]) -> str:
    parts = [f"The state_dict does not match {type(model).__name__}'s parameters."]
    if missing:
        parts.append(f"Missing keys ({len(missing)}): {_list(missing)}.")
    if unexpected:
        parts.append(f"Unexpected keys ({len(unexpected)}): {_list(unexpected)}.")
    if unexpected and all(k.startswith("module.") for k in unexpected):
        parts.append(
            "Every unexpected key starts with 'module.' (saved from DataParallel): strip "
            "that prefix first."
        )
    else:
        parts.append(
            "Check that the model was created with the same architecture options (width, "
            "stem, num_classes, ...) as the weights."
        )
    return " ".join(parts)


def torch_values(
    model: nnx.Module,
    source: str | os.PathLike | Mapping[str, Any],
    *,
    replaceable: frozenset[str] = frozenset(),
) -> tuple[dict[str, np.ndarray], list[str]]:
    """``({key: value}, left_out)``: PyTorch weights (a ``.pth`` path or a ``state_dict``)
    converted to ``model``'s layout, kernel storage and parameter dtypes, keyed by their
    ``state_dict`` names, for ``assign_torch_values``. ``model`` may be abstract
    (``nnx.eval_shape``): only its layers and shapes are read.

    Every model key must be present and no other key may be (``num_batches_tracked`` aside);
    shapes must match after the layout conversion, except for the keys in ``replaceable``
    (a classifier head being given new classes), which are left out instead and listed in
    ``left_out``."""
    state_dict = dict(source) if isinstance(source, Mapping) else read_state_dict(source)
    _check_mapping(state_dict)
    entries = _entries(model)
    expected = {e.key for e in entries}
    missing = [e.key for e in entries if e.key not in state_dict]
    unexpected = [k for k in state_dict if k not in expected and not _is_bn_counter(k)]
    if missing or unexpected:
        raise StateDictKeyError(_key_error(model, missing, unexpected))
    values, left_out, bad = {}, [], []
    for entry in entries:
        value = _to_numpy(state_dict[entry.key], entry.key)
        want = _torch_shape(entry)
        if tuple(value.shape) != want:
            if entry.key in replaceable:
                left_out.append(entry.key)
                continue
            ours = tuple(entry.variable.get_value().shape)
            bad.append(
                f"{entry.key}: the state_dict has shape {tuple(value.shape)}, the model "
                f"expects {want} (its {entry.path} is {ours})"
            )
            continue
        dtype = entry.variable.get_value().dtype
        values[entry.key] = np.asarray(_from_torch(entry, value)).astype(dtype)
    if bad:
        raise StateDictShapeError(
            f"Shape mismatch in {len(bad)} state_dict entr{'y' if len(bad) == 1 else 'ies'}: "
            + "; ".join(bad[:12])
            + (f"; ... ({len(bad) - 12} more)" if len(bad) > 12 else "")
            + ". Check the architecture options (width, num_classes, ...)."
        )
    return values, left_out


def assign_torch_values(model: nnx.Module, values: Mapping[str, Any]) -> nnx.Module:
    """``model`` (in place, also under ``jax.jit``) with the variables ``values`` names by
    ``state_dict`` key (``torch_values``) set to them; the others keep theirs."""
    for entry in _entries(model):
        if entry.key in values:
            entry.variable.set_value(jnp.asarray(values[entry.key]))
    return model


def load_torch_state_dict(
    model: nnx.Module, source: str | os.PathLike | Mapping[str, Any]
) -> nnx.Module:
    """Load PyTorch weights (a ``.pth`` path or a ``state_dict``) into ``model`` in place and
    return it. Works in either layout; values are cast to each parameter's dtype.

    Every model key must be present and no other key may be (``num_batches_tracked`` aside);
    shapes must match after the layout conversion. Nothing is written unless all entries fit.
    """
    return assign_torch_values(model, torch_values(model, source)[0])
