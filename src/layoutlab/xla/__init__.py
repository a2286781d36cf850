"""What XLA makes of a program: AOT compile reports, HLO analysis, physical layouts, caching.

- ``compile_report(fn, *args, backend=..., flags=..., in_formats=...)`` -> ``CompileReport``
- ``hlo_report(text)`` -> ``HloReport`` (op counts, fusions, transposes/copies/converts,
  convolutions with logical and physical layouts, dots); ``diff`` / ``hlo.compare_table``
- ``compare_layouts(fn, *args)``: default vs ``Layout.AUTO`` layouts, HLO and timings
- ``enable_compilation_cache(path)`` / ``cache.disable_compilation_cache()``
- ``available_backends()`` / ``resolve_backend(name)``
- ``inspect_model("resnet18", layout="NCHW", precision="mixed_bf16", mode="train")`` ->
  ``inspection.ModelInspection``; ``compare_model_layouts`` (NHWC vs NCHW); ``layoutlab inspect``


Names load lazily (``layoutlab.lazy``), so importing the package, as the CLI does
to build its parser, imports no JAX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from layoutlab.lazy import lazy_exports

if TYPE_CHECKING:
    from layoutlab.xla.backends import Backend, BackendError, available_backends, resolve_backend
    from layoutlab.xla.cache import compilation_cache, enable_compilation_cache, watch_compilation
    from layoutlab.xla.compile import CompileReport, compile_report
    from layoutlab.xla.flags import CPU_FLAGS, GPU_FLAGS, XlaFlagError, cpu_fast_options
    from layoutlab.xla.formats import (
        LayoutUnsupportedError,
        layout_api,
        major_to_minor_for,
        physical_format,
    )
    from layoutlab.xla.hlo import HloReport, conv_table, diff, hlo_report
    from layoutlab.xla.inspect import inspect_model
    from layoutlab.xla.layout_compare import compare_layouts
    from layoutlab.xla.model_layout_comparison import ModelLayoutComparison, compare_model_layouts

_EXPORTS = {
    "Backend": "backends",
    "BackendError": "backends",
    "available_backends": "backends",
    "resolve_backend": "backends",
    "compilation_cache": "cache",
    "enable_compilation_cache": "cache",
    "watch_compilation": "cache",
    "CompileReport": "compile",
    "compile_report": "compile",
    "CPU_FLAGS": "flags",
    "GPU_FLAGS": "flags",
    "XlaFlagError": "flags",
    "cpu_fast_options": "flags",
    "LayoutUnsupportedError": "formats",
    "layout_api": "formats",
    "major_to_minor_for": "formats",
    "physical_format": "formats",
    "HloReport": "hlo",
    "conv_table": "hlo",
    "diff": "hlo",
    "hlo_report": "hlo",
    "inspect_model": "inspect",
    "compare_layouts": "layout_compare",
    "ModelLayoutComparison": "model_layout_comparison",
    "compare_model_layouts": "model_layout_comparison",
}

__all__ = [
    "CPU_FLAGS",
    "GPU_FLAGS",
    "Backend",
    "BackendError",
    "CompileReport",
    "HloReport",
    "LayoutUnsupportedError",
    "ModelLayoutComparison",
    "XlaFlagError",
    "available_backends",
    "compare_layouts",
    "compare_model_layouts",
    "compilation_cache",
    "compile_report",
    "cpu_fast_options",
    "conv_table",
    "diff",
    "enable_compilation_cache",
    "hlo_report",
    "inspect_model",
    "layout_api",
    "major_to_minor_for",
    "physical_format",
    "resolve_backend",
    "watch_compilation",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, lambda: set(globals()))
