"""This machine's limits, measured once per sweep, and how close a row comes to them.

Peak compute is the best float32 matrix multiply rate of the run's backend with XLA, and on
CPU also with PyTorch (oneDNN/MKL) when it is installed: a square matmul large enough to
reach the machine's speed, timed after a warm-up, best of a few calls. Memory bandwidth is
a STREAM-like copy (NumPy, host memory) of a buffer far larger than the caches, counting
the bytes read and written. A row's achieved GFLOP/s comes from XLA's cost analysis of the
compiled step (the PyTorch row of the same workload is credited with the same FLOP count),
and ``pct_of_peak`` divides it by the higher of the two matmul peaks: the share of the
machine's best dense float32 rate that the step reaches. Convolutions and half precision
can fall short of a float32 matmul peak, or exceed it (bfloat16 units), so the figure says
how far a step is from the machine's plain float32 limit, not from a bound for that step.
"""

from __future__ import annotations

import time

import numpy as np

__all__ = ["measure_peaks", "pct_of_peak"]

_MATMUL_N = 1024  # 2.1 GFLOP a call: tens of ms on a laptop core, under 1 ms on a GPU
_CALLS = 5
_COPY_BYTES = 256 * 2**20


def _best_seconds(call, calls: int = _CALLS) -> float:
    call()  # warm-up (and compile)
    best = float("inf")
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
    return best


def _xla_matmul_gflops(backend: str | None) -> float:
    import jax
    import jax.numpy as jnp

    device = jax.devices(backend)[0] if backend else jax.devices()[0]
    a = jax.device_put(np.random.default_rng(0).standard_normal((_MATMUL_N,) * 2, np.float32),
                       device)  # fmt: skip
    # Full float32 on every backend: the peak of plain float32, not of TensorFloat32.
    f = jax.jit(lambda x: jnp.dot(x, x, precision=jax.lax.Precision.HIGHEST))
    seconds = _best_seconds(lambda: f(a).block_until_ready())
    return 2 * _MATMUL_N**3 / seconds / 1e9


def _torch_matmul_gflops() -> float | None:
    try:
        import torch
    except ImportError:
        return None
    a = torch.randn(_MATMUL_N, _MATMUL_N, dtype=torch.float32)
    seconds = _best_seconds(lambda: torch.mm(a, a))
    return 2 * _MATMUL_N**3 / seconds / 1e9


def _copy_gb_per_s() -> float:
    src = np.ones(_COPY_BYTES // 8, np.float64)
    dst = np.empty_like(src)
    seconds = _best_seconds(lambda: np.copyto(dst, src), calls=3)
    return 2 * _COPY_BYTES / seconds / 1e9  # read + write


def measure_peaks(backend: str | None = None, *, torch: bool = True) -> dict:
    """``{"xla_matmul_gflops", "torch_matmul_gflops", "copy_gb_per_s", "peak_gflops"}``;
    PyTorch is measured on CPU backends only (its GPU rate is not the run's device)."""
    import jax

    platform = jax.devices(backend)[0].platform if backend else jax.default_backend()
    xla = _xla_matmul_gflops(backend)
    peer = _torch_matmul_gflops() if torch and platform == "cpu" else None
    return {
        "xla_matmul_gflops": xla,
        "torch_matmul_gflops": peer,
        "copy_gb_per_s": _copy_gb_per_s(),
        "peak_gflops": max(x for x in (xla, peer) if x is not None),
        "matmul_size": _MATMUL_N,
    }


def pct_of_peak(gflops_per_sec: float | None, peaks: dict | None) -> float | None:
    if not gflops_per_sec or not peaks or not peaks.get("peak_gflops"):
        return None
    return 100.0 * gflops_per_sec / peaks["peak_gflops"]
