"""PyTorch ``state_dict`` import and export: ``layoutlab.models.torch_weights``, which holds
them, under the comparison layer's name (``train --init`` loads weights below ``compare/``
in the repository map, so the code lives in ``models/``)."""

from __future__ import annotations

from layoutlab.models.torch_weights import (
    TORCH_MISSING,
    StateDictKeyError,
    StateDictShapeError,
    load_torch_state_dict,
    read_state_dict,
    require_torch,
    stored_kernel_layout,
    to_torch_state_dict,
    torch_keys,
)

__all__ = [
    "TORCH_MISSING",
    "StateDictKeyError",
    "StateDictShapeError",
    "load_torch_state_dict",
    "read_state_dict",
    "require_torch",
    "stored_kernel_layout",
    "to_torch_state_dict",
    "torch_keys",
]
