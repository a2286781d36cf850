"""What XLA makes of a program: AOT compile reports, HLO analysis, physical layouts, caching.

- ``compile_report(fn, *args, backend=..., flags=..., in_formats=...)`` -> ``CompileReport``
- ``hlo_report(text)`` -> ``HloReport`` (op counts, fusions, transposes/copies/converts,
  convolutions with logical and physical layouts, dots); ``diff`` / ``compare_table``
- ``compare_layouts(fn, *args)``: default vs ``Layout.AUTO`` layouts, HLO and timings
- ``enable_compilation_cache(path)`` / ``disable_compilation_cache()``
- ``available_backends()`` / ``resolve_backend(name)``
- ``inspect_model("resnet18", layout="NCHW", precision="mixed_bf16", mode="train")`` ->
  ``ModelInspection``; ``compare_model_layouts`` (NHWC vs NCHW); ``layoutlab inspect``


Names load lazily (``layoutlab.lazy``), so importing the package, as the CLI does
to build its parser, imports no JAX.
"""

from __future__ import annotations

from layoutlab.lazy import lazy_exports

_EXPORTS = {
    "Backend": "backends",
    "BackendError": "backends",
    "available_backends": "backends",
    "resolve_backend": "backends",
    "compilation_cache": "cache",
    "disable_compilation_cache": "cache",
    "enable_compilation_cache": "cache",
    "watch_compilation": "cache",
    "CompileReport": "compile",
    "compile_report": "compile",
    "ConvRow": "conv_rows",
    "CPU_FAST_OPTIONS": "flags",
    "CPU_FLAGS": "flags",
    "GPU_FLAGS": "flags",
    "XlaFlagError": "flags",
    "cpu_fast_options": "flags",
    "LayoutAPIUnavailable": "formats",
    "LayoutUnsupportedError": "formats",
    "auto_format": "formats",
    "layout_api": "formats",
    "major_to_minor_for": "formats",
    "physical_format": "formats",
    "place_in_formats": "formats",
    "HloReport": "hlo",
    "compare_table": "hlo",
    "conv_table": "hlo",
    "diff": "hlo",
    "hlo_report": "hlo",
    "decode_dim_labels": "hlo_extract",
    "ConvOp": "hlo_ops",
    "DataMoveOp": "hlo_ops",
    "DotOp": "hlo_ops",
    "HloParseError": "hlo_parse",
    "parse_hlo": "hlo_parse",
    "inspect_model": "inspect",
    "ModelInspection": "inspection",
    "LayoutComparison": "layout_compare",
    "compare_layouts": "layout_compare",
    "time_call": "layout_compare",
    "ModelLayoutComparison": "model_layout_comparison",
    "compare_model_layouts": "model_layout_comparison",
}

__all__ = [
    "CPU_FAST_OPTIONS",
    "CPU_FLAGS",
    "GPU_FLAGS",
    "Backend",
    "BackendError",
    "CompileReport",
    "ConvOp",
    "ConvRow",
    "DataMoveOp",
    "DotOp",
    "HloParseError",
    "HloReport",
    "LayoutAPIUnavailable",
    "LayoutComparison",
    "LayoutUnsupportedError",
    "ModelInspection",
    "ModelLayoutComparison",
    "XlaFlagError",
    "auto_format",
    "available_backends",
    "compare_layouts",
    "compare_model_layouts",
    "compare_table",
    "compilation_cache",
    "compile_report",
    "cpu_fast_options",
    "conv_table",
    "decode_dim_labels",
    "diff",
    "disable_compilation_cache",
    "enable_compilation_cache",
    "hlo_report",
    "inspect_model",
    "layout_api",
    "major_to_minor_for",
    "parse_hlo",
    "physical_format",
    "place_in_formats",
    "resolve_backend",
    "time_call",
    "watch_compilation",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, lambda: set(globals()))
