"""Default layouts vs ``Layout.AUTO``: what XLA's layout choice removes, in HLO and in time.

``compare_layouts(fn, *args)`` compiles ``fn`` twice, with default (row-major) input/output
layouts and with ``AUTO`` ones, and reports the transposes and memory permutations of each
optimized HLO and the median call time. The AUTO run's inputs are copied into the chosen
layouts once, before timing, the way parameters would be stored between training steps. Its
outputs stay in XLA's chosen layout, so a consumer that needs row-major data pays the
transpose there instead.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Sequence

import jax

from layoutlab.xla.compile import CompileReport, compile_report
from layoutlab.xla.hlo import compare_table

__all__ = ["LayoutComparison", "compare_layouts", "time_call"]

_KEYS = [
    "transposes",
    "transposes_top_level",
    "transposes_nested",
    "memory_permutations",
    "memory_permutation_bytes",
    "copies",
    "fusions",
]


def time_call(f, args=(), kwargs=None, *, repeats: int = 10, warmup: int = 1) -> float:
    """Median wall time in seconds of ``f(*args, **kwargs)``, waiting for the result."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    kwargs = kwargs or {}
    for _ in range(warmup):
        jax.block_until_ready(f(*args, **kwargs))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args, **kwargs))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@dataclasses.dataclass
class LayoutComparison:
    default: CompileReport
    auto: CompileReport
    default_seconds: float | None
    auto_seconds: float | None

    def table(self) -> str:
        text = compare_table({"default": self.default.hlo, "auto": self.auto.hlo}, _KEYS)
        if self.default_seconds is not None and self.auto_seconds is not None:
            text += (
                f"\nmedian call: default {self.default_seconds * 1e6:.1f} us, "
                f"auto {self.auto_seconds * 1e6:.1f} us"
            )
        return text

    def to_dict(self) -> dict:
        return {
            "default": self.default.to_dict(include_text=False),
            "auto": self.auto.to_dict(include_text=False),
            "default_seconds": self.default_seconds,
            "auto_seconds": self.auto_seconds,
        }


def _concrete(args, kwargs) -> bool:
    leaves = jax.tree_util.tree_leaves((args, kwargs))
    return not any(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)


def compare_layouts(
    fn,
    *args,
    backend: str | None = None,
    static_argnums: int | Sequence[int] = (),
    repeats: int = 10,
    in_formats="auto",
    out_formats="auto",
    **kwargs,
) -> LayoutComparison:
    """Compile ``fn`` with default and with AUTO (or the given) layouts; time both when the
    arguments are concrete arrays (``repeats=0`` skips timing)."""
    default = compile_report(fn, *args, backend=backend, static_argnums=static_argnums, **kwargs)
    auto = compile_report(
        fn,
        *args,
        backend=backend,
        static_argnums=static_argnums,
        in_formats=in_formats,
        out_formats=out_formats,
        **kwargs,
    )
    t_default = t_auto = None
    if repeats > 0 and _concrete(args, kwargs):
        d_args, d_kwargs = default.place_inputs(*args, **kwargs)
        a_args, a_kwargs = auto.place_inputs(*args, **kwargs)
        t_default = time_call(default.compiled, d_args, d_kwargs, repeats=repeats)
        t_auto = time_call(auto.compiled, a_args, a_kwargs, repeats=repeats)
    return LayoutComparison(default, auto, t_default, t_auto)
