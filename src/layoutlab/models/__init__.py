"""Model registry and architectures, built only from ``layoutlab.nn``.

``names()`` lists them, ``create(name, num_classes=, layout=, policy=, rngs=,
kernel_storage=, activation_storage=, **kw)`` builds one (the two storages default to the
backend's fast defaults: on CPU, HWIO kernels and channels-last inside).


Names load lazily (``layoutlab.lazy``), so importing the package, as the CLI does
to build its parser, imports no JAX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from layoutlab.lazy import lazy_exports

if TYPE_CHECKING:
    from layoutlab.models.registry import (
        ModelSpec,
        create,
        example_shape,
        has_depthwise_convs,
        largest_conv_output,
        model_compile_options,
        names,
        register,
        resolve_layout,
        spec,
        table_runs_onednn,
        unregister,
    )

_EXPORTS = {
    "ModelSpec": "registry",
    "create": "registry",
    "example_shape": "registry",
    "has_depthwise_convs": "registry",
    "largest_conv_output": "registry",
    "model_compile_options": "registry",
    "names": "registry",
    "register": "registry",
    "resolve_layout": "registry",
    "spec": "registry",
    "table_runs_onednn": "registry",
    "unregister": "registry",
}

__all__ = [
    "ModelSpec",
    "create",
    "example_shape",
    "has_depthwise_convs",
    "largest_conv_output",
    "model_compile_options",
    "names",
    "register",
    "resolve_layout",
    "spec",
    "table_runs_onednn",
    "unregister",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, lambda: set(globals()))
