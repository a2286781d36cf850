"""What XLA makes of a program: AOT compile reports, HLO analysis, physical layouts, caching.

- ``compile_report(fn, *args, backend=..., flags=..., in_formats=...)`` -> ``CompileReport``
- ``hlo_report(text)`` -> ``HloReport`` (op counts, fusions, transposes/copies/converts,
  convolutions with logical and physical layouts, dots); ``diff`` / ``compare_table``
- ``compare_layouts(fn, *args)``: default vs ``Layout.AUTO`` layouts, HLO and timings
- ``enable_compilation_cache(path)`` / ``disable_compilation_cache()``
- ``available_backends()`` / ``resolve_backend(name)``
- ``keep_host_memory()``: freed host memory stays in the process (XLA:CPU's per-call temp
  buffer stops page-faulting); call before JAX starts
- ``inspect_model("resnet18", layout="NCHW", precision="mixed_bf16", mode="train")`` ->
  ``ModelInspection``; ``compare_model_layouts`` (NHWC vs NCHW); ``layoutlab inspect``
"""

from layoutlab.xla.backends import Backend, BackendError, available_backends, resolve_backend
from layoutlab.xla.cache import (
    compilation_cache,
    disable_compilation_cache,
    enable_compilation_cache,
    watch_compilation,
)
from layoutlab.xla.compile import CompileReport, compile_report
from layoutlab.xla.conv_rows import ConvRow
from layoutlab.xla.flags import (
    CPU_FAST_OPTIONS,
    CPU_FLAGS,
    GPU_FLAGS,
    XlaFlagError,
    cpu_fast_options,
)
from layoutlab.xla.formats import (
    LayoutAPIUnavailable,
    LayoutUnsupportedError,
    auto_format,
    layout_api,
    major_to_minor_for,
    physical_format,
    place_in_formats,
)
from layoutlab.xla.hlo import HloReport, compare_table, conv_table, diff, hlo_report
from layoutlab.xla.hlo_extract import decode_dim_labels
from layoutlab.xla.hlo_ops import ConvOp, DataMoveOp, DotOp
from layoutlab.xla.hlo_parse import HloParseError, parse_hlo
from layoutlab.xla.host_memory import (
    HostMemoryError,
    HostMemoryState,
    host_memory_state,
    keep_host_memory,
)
from layoutlab.xla.inspect import inspect_model
from layoutlab.xla.inspection import ModelInspection
from layoutlab.xla.layout_compare import LayoutComparison, compare_layouts, time_call
from layoutlab.xla.model_layout_comparison import ModelLayoutComparison, compare_model_layouts

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
    "HostMemoryError",
    "HostMemoryState",
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
    "host_memory_state",
    "inspect_model",
    "keep_host_memory",
    "layout_api",
    "major_to_minor_for",
    "parse_hlo",
    "physical_format",
    "place_in_formats",
    "resolve_backend",
    "time_call",
    "watch_compilation",
]
