"""XLA flags for one compile, and the flags in force.

``XLA_FLAGS`` is read once, when a backend starts, so changing it later does nothing. Flags
for a single compile go through ``lowered.compile(compiler_options={...})`` instead, which
sets fields of XLA's ``DebugOptions`` for that executable only. XLA rejects unknown names
(``No such compile option``) and badly typed values; ``compile_report`` turns those into
``XlaFlagError`` naming the flag. A GPU flag passed on CPU is accepted and has no effect.

The tables below list flags checked to be accepted as compile options by jaxlib 0.10.2;
other ``DebugOptions`` fields work too.
"""

from __future__ import annotations

import os
import shlex

# The fast-default tables live in the ``fast_defaults`` leaf, which train/ reads too.
from layoutlab.fast_defaults import CPU_FAST_OPTIONS, cpu_fast_options

__all__ = [
    "CPU_FAST_OPTIONS",
    "CPU_FLAGS",
    "GPU_FLAGS",
    "COMMON_FLAGS",
    "XlaFlagError",
    "cpu_fast_options",
    "flags_in_force",
    "normalize_flags",
    "parse_xla_flags",
    "translate_compile_error",
]

CPU_FLAGS = {
    "xla_cpu_enable_fast_math": "allow LLVM fast-math rewrites (reassociation, approximations)",
    "xla_cpu_fast_math_honor_nans": "with fast math, keep NaN semantics",
    "xla_cpu_fast_math_honor_infs": "with fast math, keep Inf semantics",
    "xla_cpu_fast_math_honor_division": "with fast math, keep exact division",
    "xla_cpu_fast_math_honor_functions": "with fast math, keep exact transcendental functions",
    "xla_cpu_enable_fast_min_max": "min/max without NaN propagation",
    "xla_cpu_multi_thread_eigen": "let Eigen convs/dots use the intra-op thread pool",
    "xla_cpu_prefer_vector_width": "preferred SIMD width in bits (128, 256, 512)",
    "xla_cpu_use_onednn": "rewrite convs/dots to oneDNN custom-calls where supported",
    "xla_cpu_use_xnnpack": "use XNNPACK kernels where supported",
    "xla_cpu_use_fusion_emitters": "use the MLIR fusion emitters",
    "xla_cpu_strict_dot_conv_math": "compute dots/convs in the requested precision only",
    "xla_cpu_parallel_codegen_split_count": "split LLVM modules for parallel codegen",
    "xla_cpu_max_isa": "cap the instruction set, e.g. 'AVX2'",
    "xla_cpu_experimental_ynn_fusion_type": (
        "comma-separated op kinds XLA:CPU hands to YNNPACK (LIBRARY_FUSION_TYPE_ + DOT, "
        "INDIVIDUAL_DOT, INDIVIDUAL_CONVOLUTION, REDUCE, ELTWISE); leaving out "
        "INDIVIDUAL_CONVOLUTION runs convs on Eigen (see CPU_FAST_OPTIONS)"
    ),
}

GPU_FLAGS = {
    "xla_gpu_autotune_level": "0 disables conv/gemm autotuning, 4 (default) is the most thorough",
    "xla_gpu_force_conv_nhwc": "lay out every conv as NHWC for cuDNN",
    "xla_gpu_force_conv_nchw": "lay out every conv as NCHW for cuDNN",
    "xla_gpu_enable_triton_gemm": "emit gemms with Triton instead of cuBLAS where profitable",
    "xla_gpu_enable_cublaslt": "use cuBLASLt for gemms",
    "xla_gpu_exclude_nondeterministic_ops": "refuse ops with non-deterministic results",
    "xla_gpu_deterministic_ops": "deterministic reductions and scatters (slower)",
    "xla_gpu_enable_latency_hiding_scheduler": "overlap communication with compute",
    "xla_gpu_enable_command_buffer": "which ops go into CUDA graphs ('' disables them)",
    "xla_gpu_enable_fast_min_max": "min/max without NaN propagation",
    "xla_gpu_use_runtime_fusion": "cuDNN runtime-compiled fused convs",
    "xla_gpu_enable_dynamic_slice_fusion": "fuse dynamic slices into library calls",
    "xla_gpu_cuda_data_dir": "where ptxas/libdevice are found",
}

COMMON_FLAGS = {
    "xla_backend_optimization_level": "LLVM optimization level (0-3)",
    "xla_llvm_disable_expensive_passes": "skip slow LLVM passes",
    "xla_disable_hlo_passes": "comma-separated HLO pass names to skip",
    "xla_allow_excess_precision": "allow computing bf16/f16 in f32 where cheaper",
    "xla_dump_to": "directory for HLO dumps of this compile",
    "xla_dump_hlo_as_text": "dump HLO as text (with xla_dump_to)",
    "xla_detailed_logging": "log compile details",
}


class XlaFlagError(ValueError):
    """XLA refused a per-compile flag (unknown name or wrong value type)."""


def _known_list(platform: str | None) -> str:
    table = {**COMMON_FLAGS, **(GPU_FLAGS if platform == "gpu" else CPU_FLAGS)}
    return ", ".join(sorted(table))


def normalize_flags(flags: dict | None) -> dict[str, bool | int | float | str]:
    """Strip a leading ``--`` from names and check values are bool, int, float or str."""
    if flags is None:
        return {}
    if not isinstance(flags, dict):
        raise XlaFlagError(
            f"flags must be a dict such as {{'xla_cpu_enable_fast_math': True}}, got {flags!r}"
        )
    out = {}
    for name, value in flags.items():
        if not isinstance(name, str) or not name.strip("-"):
            raise XlaFlagError(f"flag names must be non-empty strings, got {name!r}")
        if not isinstance(value, bool | int | float | str):
            raise XlaFlagError(
                f"flag {name!r} has value {value!r} of type {type(value).__name__}; "
                "use a bool, int, float or str"
            )
        out[name.strip().lstrip("-")] = value
    return out


def parse_xla_flags(text: str | None = None) -> dict[str, str]:
    """``"--a=1 --b"`` -> ``{"a": "1", "b": "true"}``; defaults to the ``XLA_FLAGS`` env var."""
    text = os.environ.get("XLA_FLAGS", "") if text is None else text
    out = {}
    for token in shlex.split(text):
        name, eq, value = token.lstrip("-").partition("=")
        if name:
            out[name] = value if eq else "true"
    return out


def flags_in_force(compiler_options: dict | None) -> dict[str, dict]:
    """The per-compile options and the process-wide ``XLA_FLAGS`` that applied to a compile."""
    return {
        "compiler_options": dict(compiler_options or {}),
        "XLA_FLAGS": parse_xla_flags(),
    }


def translate_compile_error(err: Exception, flags: dict, platform: str | None) -> Exception | None:
    """An ``XlaFlagError`` for a compile error caused by ``flags``, else None."""
    msg = str(err)
    if "No such compile option" in msg:
        bad = [name for name in flags if f"'{name}'" in msg] or list(flags)
        return XlaFlagError(
            f"XLA does not know the flag(s) {', '.join(bad)} (this jaxlib rejects them as "
            f"compile options). Flags known to work for {platform or 'this backend'}: "
            f"{_known_list(platform)}."
        )
    if "While setting option" in msg:
        detail = msg.split("While setting option", 1)[1].strip()
        return XlaFlagError(f"Bad value for XLA flag: option {detail}")
    return None
