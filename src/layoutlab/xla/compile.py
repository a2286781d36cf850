"""Ahead-of-time lowering and compiling with a report of what XLA made of a function.

``compile_report(fn, *args, backend="cpu")`` lowers and compiles ``fn`` for the given
arguments (arrays, ``jax.ShapeDtypeStruct``\\ s or Python scalars) without running it, and
records timings, XLA's cost and memory analyses, the optimized and pre-optimization HLO, the
flags in force, whether the persistent cache served it, and the input/output layouts.

Backend choice: ``jax.jit(..., backend=...)`` is deprecated in jax 0.10, so array arguments
are lowered as ``ShapeDtypeStruct``\\ s placed on the backend's first device (jax's
recommended replacement), inside ``jax.default_device`` for computations without arrays.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from layoutlab.xla import formats as fmt
from layoutlab.xla.backends import Backend, resolve_backend
from layoutlab.xla.cache import watch_compilation
from layoutlab.xla.custom_call_cost import XLA_FLOPS_PER_CUSTOM_CALL, onednn_flops_in
from layoutlab.xla.flags import flags_in_force, normalize_flags, translate_compile_error
from layoutlab.xla.hlo import HloReport, conv_table, hlo_report
from layoutlab.xla.hlo_extract import ONEDNN_PREFIX

__all__ = ["CompileReport", "compile_report", "cost_summary", "memory_summary"]

_MEMORY_FIELDS = (
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "alias_size_in_bytes",
    "temp_size_in_bytes",
    "generated_code_size_in_bytes",
    "peak_memory_in_bytes",
    "host_argument_size_in_bytes",
    "host_output_size_in_bytes",
    "host_alias_size_in_bytes",
    "host_temp_size_in_bytes",
    "host_generated_code_size_in_bytes",
)


def cost_summary(compiled, hlo_text: str | None = None) -> dict:
    """``compiled.cost_analysis()`` as ``{"flops", "bytes_accessed", "transcendentals",
    "optimal_seconds", "onednn_flops", "raw"}``; older jax returns a list with one dict per
    program. ``flops`` includes the convs run as oneDNN calls (``onednn_flops``, counted from
    their shapes by ``custom_call_cost``), which XLA's analysis cannot see. ``hlo_text``:
    ``compiled.as_text()`` where the caller has it already (else it is read here)."""
    try:
        raw = compiled.cost_analysis()
    except Exception:  # some backends do not implement it
        raw = None
    if isinstance(raw, Sequence) and not isinstance(raw, str | bytes):
        raw = raw[0] if raw else None
    if not isinstance(raw, Mapping):
        raw = {}
    clean = {str(k): float(v) for k, v in raw.items() if isinstance(v, int | float | np.number)}
    flops, onednn = clean.get("flops"), _onednn_flops(compiled, hlo_text)
    if flops is not None and onednn is not None:
        extra, calls = onednn
        flops = flops - calls * XLA_FLOPS_PER_CUSTOM_CALL + extra
    return {
        "flops": flops,
        "onednn_flops": onednn[0] if onednn else None,
        "bytes_accessed": clean.get("bytes accessed"),
        "transcendentals": clean.get("transcendentals"),
        "optimal_seconds": clean.get("optimal_seconds"),
        "raw": clean,
    }


def _onednn_flops(compiled, text: str | None) -> tuple[float, int] | None:
    if text is None:
        try:
            text = compiled.as_text()
        except Exception:  # an executable without text: nothing to add
            return None
    if not isinstance(text, str) or ONEDNN_PREFIX not in text:
        return None
    return onednn_flops_in(hlo_report(text).custom_calls)


def memory_summary(compiled) -> dict | None:
    """``compiled.memory_analysis()`` as a dict of byte counts (None where not reported)."""
    try:
        stats = compiled.memory_analysis()
    except Exception:  # some backends do not implement it
        stats = None
    if stats is None:
        return None
    out = {}
    for name in _MEMORY_FIELDS:
        value = getattr(stats, name, None)
        out[name.removesuffix("_in_bytes")] = int(value) if value is not None else None
    return out


def _versions() -> dict[str, str | None]:
    try:
        import jaxlib

        jaxlib_version = getattr(jaxlib, "__version__", None)
    except ImportError:  # pragma: no cover
        jaxlib_version = None
    return {"jax": jax.__version__, "jaxlib": jaxlib_version}


@dataclasses.dataclass
class CompileReport:
    """What compiling one function produced. ``compiled``/``lowered`` are the jax objects."""

    name: str
    backend: str
    platform: str
    device_kind: str
    platform_version: str | None
    versions: dict[str, str | None]
    lower_seconds: float
    compile_seconds: float
    cost: dict
    memory: dict | None
    hlo_text: str | None
    pre_hlo_text: str | None
    flags: dict
    cache_hit: bool | None  # served from the persistent cache (None: cache not consulted)
    in_memory_cache_hit: bool | None  # jax reused an executable already built in-process
    input_formats: list[dict] | None
    output_formats: list[dict] | None
    compiled: Any = dataclasses.field(repr=False, compare=False, default=None)
    lowered: Any = dataclasses.field(repr=False, compare=False, default=None)
    static_argnums: tuple[int, ...] = ()

    @functools.cached_property
    def hlo(self) -> HloReport | None:
        """Report of the optimized HLO (what runs)."""
        return hlo_report(self.hlo_text) if self.hlo_text else None

    @functools.cached_property
    def hlo_before(self) -> HloReport | None:
        """Report of the HLO before XLA's optimizations (what the program asked for)."""
        return hlo_report(self.pre_hlo_text) if self.pre_hlo_text else None

    def place_inputs(self, *args, **kwargs):
        """``(args, kwargs)`` copied into the layouts the executable expects (statics dropped)."""
        dyn = tuple(a for i, a in enumerate(args) if i not in self.static_argnums)
        return fmt.place_in_formats(self.compiled, *dyn, **kwargs)

    def run(self, *args, **kwargs):
        """Place the inputs in the compiled formats and call the executable."""
        p_args, p_kwargs = self.place_inputs(*args, **kwargs)
        return self.compiled(*p_args, **p_kwargs)

    def to_dict(self, include_text: bool = True) -> dict:
        """JSON-serializable view; ``include_text=False`` leaves out the HLO texts."""
        out = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("compiled", "lowered")
        }
        out["static_argnums"] = list(self.static_argnums)
        if not include_text:
            out.pop("hlo_text")
            out.pop("pre_hlo_text")
        out["hlo"] = self.hlo.to_dict() if self.hlo else None
        out["hlo_before"] = self.hlo_before.to_dict() if self.hlo_before else None
        return json.loads(json.dumps(out, default=str))

    def summary(self) -> str:
        def n(v, unit=""):
            return "n/a" if v is None else f"{int(v):,}{unit}"

        def yes_no(v):
            return "n/a" if v is None else ("yes" if v else "no")

        c, m = self.cost, self.memory or {}
        lines = [
            f"{self.name} on {self.backend} ({self.device_kind}; jax {self.versions['jax']}, "
            f"jaxlib {self.versions['jaxlib']})",
            f"  lower {self.lower_seconds:.3f} s, compile {self.compile_seconds:.3f} s; "
            f"persistent cache hit: {yes_no(self.cache_hit)}; "
            f"reused in-process: {yes_no(self.in_memory_cache_hit)}",
            f"  cost: {n(c.get('flops'))} flops, {n(c.get('bytes_accessed'))} bytes accessed, "
            f"{n(c.get('transcendentals'))} transcendentals",
        ]
        if self.memory is not None:
            lines.append(
                f"  memory: arguments {n(m.get('argument_size'), ' B')}, outputs "
                f"{n(m.get('output_size'), ' B')}, aliased {n(m.get('alias_size'), ' B')}, "
                f"temp {n(m.get('temp_size'), ' B')}, code "
                f"{n(m.get('generated_code_size'), ' B')}, peak {n(m.get('peak_memory'), ' B')}"
            )
        lines.append(
            f"  flags: compiler_options={self.flags['compiler_options']} "
            f"XLA_FLAGS={self.flags['XLA_FLAGS']}"
        )
        for label, infos in (("input", self.input_formats), ("output", self.output_formats)):
            odd = [i for i in infos or [] if i["is_default"] is False]
            if odd:
                desc = ", ".join(f"{i['path'] or '.'}{i['major_to_minor']}" for i in odd)
                lines.append(f"  non-default {label} layouts (major_to_minor): {desc}")
        if self.hlo is not None:
            lines.append(self.hlo.summary())
            if self.hlo.convolutions:
                lines.append("  " + conv_table(self.hlo).replace("\n", "\n  "))
        return "\n".join(lines)


# ---------------------------------------------------------------- argument placement


def _place_leaf(x, be: Backend):
    """Arrays become ShapeDtypeStructs on the backend's device; other leaves pass through."""
    if isinstance(x, jax.ShapeDtypeStruct):
        sharding = getattr(x, "sharding", None)
        if sharding is not None and _on_platform(sharding, be.platform):
            return x
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=_single(be))
    if isinstance(x, jax.Array):
        if _on_platform(x.sharding, be.platform) and len(x.sharding.device_set) > 1:
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=_single(be))
    if isinstance(x, np.ndarray | np.generic):
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=_single(be))
    return x


def _single(be: Backend):
    return jax.sharding.SingleDeviceSharding(be.device)


def _on_platform(sharding, platform: str) -> bool:
    try:
        return all(d.platform == platform for d in sharding.device_set)
    except AttributeError:  # e.g. a Format wrapping a sharding
        return False


def _place_args(args, kwargs, static_argnums, be: Backend):
    placed = tuple(
        a if i in static_argnums else jax.tree_util.tree_map(lambda x: _place_leaf(x, be), a)
        for i, a in enumerate(args)
    )
    placed_kwargs = jax.tree_util.tree_map(lambda x: _place_leaf(x, be), kwargs)
    return placed, placed_kwargs


def _argnums(value, what: str) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    try:
        return tuple(int(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be an int or a sequence of ints, got {value!r}") from None


def _jit(fn, static_argnums, donate_argnums, in_sh, out_sh):
    if not callable(fn):
        raise ValueError(f"compile_report needs a callable, got {type(fn).__name__}")
    already_jitted = hasattr(fn, "lower") and hasattr(fn, "trace")
    sharding_kw = {}
    if in_sh is not None:
        sharding_kw["in_shardings"] = in_sh
    if out_sh is not None:
        sharding_kw["out_shardings"] = out_sh
    if already_jitted:
        if static_argnums or donate_argnums:
            raise ValueError(
                "fn is already jitted: set static_argnums/donate_argnums on its jax.jit, or pass "
                "the plain function to compile_report"
            )
        return jax.jit(fn, **sharding_kw) if sharding_kw else fn
    return jax.jit(fn, static_argnums=static_argnums, donate_argnums=donate_argnums, **sharding_kw)


def _pre_hlo(lowered) -> str | None:
    try:
        return lowered.as_text(dialect="hlo")
    except Exception:  # older jax: go through the XLA computation
        try:
            return lowered.compiler_ir("hlo").as_hlo_text()
        except Exception:
            return None


def _format_infos(compiled, which: str) -> list[dict] | None:
    try:
        if which == "in":
            infos = fmt.format_infos(fmt.input_formats(compiled), compiled.in_avals)
        else:
            infos = fmt.format_infos(fmt.output_formats(compiled), compiled.out_info)
    except Exception:  # no layout API, or this backend does not report layouts
        return None
    return [i._asdict() for i in infos]


def _about_layouts(err: Exception) -> bool:
    msg = str(err).lower()
    return "layout" in msg or "format" in msg


# ---------------------------------------------------------------- entry point


def compile_report(
    fn,
    *args,
    backend: str | None = None,
    static_argnums: int | Sequence[int] = (),
    donate_argnums: int | Sequence[int] = (),
    flags: dict | None = None,
    in_formats=None,
    out_formats=None,
    **kwargs,
) -> CompileReport:
    """Lower and compile ``fn(*args, **kwargs)`` ahead of time and report on the result.

    ``backend``: ``"cpu"``, ``"gpu"`` or None (jax's default). ``flags``: XLA options for
    this compile only (see ``layoutlab.xla.flags``). ``in_formats``/``out_formats``:
    ``"auto"`` to let XLA pick layouts, Format objects (``layoutlab.xla.formats``), or None.
    """
    be = resolve_backend(backend)
    options = normalize_flags(flags)
    static = _argnums(static_argnums, "static_argnums")
    donate = _argnums(donate_argnums, "donate_argnums")
    in_sh, out_sh = fmt.resolve_formats(in_formats), fmt.resolve_formats(out_formats)
    jitted = _jit(fn, static, donate, in_sh, out_sh)
    p_args, p_kwargs = _place_args(args, kwargs, static, be)
    uses_formats = in_sh is not None or out_sh is not None

    with jax.default_device(be.device), watch_compilation() as events:
        t0 = time.perf_counter()
        try:
            lowered = jitted.lower(*p_args, **p_kwargs)
        except (ValueError, TypeError) as err:
            if uses_formats and _about_layouts(err):
                raise fmt.LayoutUnsupportedError(
                    f"jax refused the requested formats on {be.name}: {err}"
                ) from None
            raise
        t1 = time.perf_counter()
        try:
            compiled = lowered.compile(compiler_options=options or None)
        except Exception as err:
            flag_err = translate_compile_error(err, options, be.platform) if options else None
            if flag_err is not None:
                raise flag_err from None
            if uses_formats and _about_layouts(err):
                raise fmt.LayoutUnsupportedError(
                    f"the {be.name} backend cannot compile with the requested layouts "
                    f"(in_formats={in_formats!r}, out_formats={out_formats!r}): {err}"
                ) from None
            raise
        t2 = time.perf_counter()

    try:
        hlo_text = compiled.as_text()
    except Exception:  # some runtimes do not expose optimized HLO
        hlo_text = None
    return CompileReport(
        name=getattr(fn, "__name__", type(fn).__name__),
        backend=be.name,
        platform=be.platform,
        device_kind=be.device_kind,
        platform_version=be.platform_version,
        versions=_versions(),
        lower_seconds=t1 - t0,
        compile_seconds=t2 - t1,
        cost=cost_summary(compiled, hlo_text),
        memory=memory_summary(compiled),
        hlo_text=hlo_text,
        pre_hlo_text=_pre_hlo(lowered),
        flags=flags_in_force(options),
        cache_hit=events.cache_hit,
        in_memory_cache_hit=events.in_memory_hit,
        input_formats=_format_infos(compiled, "in"),
        output_formats=_format_infos(compiled, "out"),
        compiled=compiled,
        lowered=lowered,
        static_argnums=static,
    )
