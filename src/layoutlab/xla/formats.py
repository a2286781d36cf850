"""Physical layouts through JAX's Format/Layout API, on whichever jax version is installed.

A *format* is a (device-local layout, sharding) pair; a *layout* is the order of an array's
dims in memory (``major_to_minor``). ``Layout.AUTO`` lets XLA choose the layout of a
function's inputs or outputs, so it can drop the transposes it would otherwise insert around
layout-sensitive ops (an NCHW conv runs NHWC on CPU). The compiled function then expects its
inputs in the chosen formats: ``place_in_formats`` puts arrays there (a one-time copy) before
the call.

Names across jax versions: 0.7+ (incl. 0.10) ``jax.experimental.layout.Format`` and
``Layout`` (device-local, with ``AUTO``); before that ``jax.experimental.layout.Layout``
meant the format and ``DeviceLocalLayout`` the layout. Newer releases may also export them
from ``jax`` or ``jax.sharding``; ``layout_api()`` looks in each place.

On CPU (jaxlib 0.10.2) XLA keeps entry *parameters* in the default row-major layout even
under ``AUTO`` (it copies them in), but does choose result layouts: an NCHW conv's result
comes back physically NHWC and its output transpose disappears.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any, NamedTuple

import jax

__all__ = [
    "LayoutAPI",
    "LayoutAPIUnavailable",
    "LayoutUnsupportedError",
    "FormatInfo",
    "auto_format",
    "describe_format",
    "format_infos",
    "input_formats",
    "layout_api",
    "layout_format",
    "major_to_minor_for",
    "output_formats",
    "physical_format",
    "place_in_formats",
    "resolve_formats",
]


class LayoutAPIUnavailable(RuntimeError):
    """This jax has no Format/Layout API that layoutlab can use."""


class LayoutUnsupportedError(ValueError):
    """The backend refused the requested layouts (e.g. ``Layout.AUTO``)."""


class LayoutAPI(NamedTuple):
    format_cls: type  # Format(layout, sharding)
    layout_cls: type  # device-local layout: Layout(major_to_minor=...)
    auto: Any  # the AUTO marker
    source: str  # where the names were found
    compiled_inputs: str  # Compiled attribute: "input_formats" or "input_layouts"
    compiled_outputs: str
    array_attr: str  # Array attribute: "format" or "layout"


def _get(module: str, name: str):
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


def _is_local_layout(cls) -> bool:
    if not isinstance(cls, type) or not hasattr(cls, "AUTO"):
        return False
    try:
        return "major_to_minor" in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False


@functools.cache
def layout_api() -> LayoutAPI:
    """The installed jax's Format/Layout classes; raises ``LayoutAPIUnavailable`` if none."""
    for module in ("jax", "jax.sharding", "jax.experimental.layout"):
        fmt, lay = _get(module, "Format"), _get(module, "Layout")
        if isinstance(fmt, type) and _is_local_layout(lay):
            return LayoutAPI(
                fmt, lay, lay.AUTO, module, "input_formats", "output_formats", "format"
            )
    old_fmt = _get("jax.experimental.layout", "Layout")
    old_lay = _get("jax.experimental.layout", "DeviceLocalLayout")
    if isinstance(old_fmt, type) and _is_local_layout(old_lay):
        return LayoutAPI(
            old_fmt,
            old_lay,
            old_lay.AUTO,
            "jax.experimental.layout (DeviceLocalLayout)",
            "input_layouts",
            "output_layouts",
            "layout",
        )
    raise LayoutAPIUnavailable(
        f"jax {jax.__version__} has no usable Format/Layout API (looked for Format and Layout "
        "in jax, jax.sharding and jax.experimental.layout, and for DeviceLocalLayout). "
        "Physical-layout control needs jax >= 0.4.31; default-layout compiles still work."
    )


def auto_format(sharding=None):
    """A format that lets XLA choose the layout (``Format(Layout.AUTO, sharding)``)."""
    api = layout_api()
    return api.format_cls(api.auto, sharding)


def layout_format(major_to_minor: tuple[int, ...], sharding=None):
    """A format with an explicit memory order, dims listed from slowest to fastest."""
    api = layout_api()
    order = tuple(int(d) for d in major_to_minor)
    if sorted(order) != list(range(len(order))):
        raise ValueError(f"major_to_minor must be a permutation of 0..n-1, got {order}")
    return api.format_cls(api.layout_cls(major_to_minor=order), sharding)


def major_to_minor_for(logical: str, physical: str) -> tuple[int, ...]:
    """Memory order that stores an array of axes ``logical`` as ``physical``.

    ``major_to_minor_for("NCHW", "NHWC") == (0, 2, 3, 1)``; kernels:
    ``major_to_minor_for("OIHW", "HWIO") == (2, 3, 1, 0)``.
    """
    logical, physical = logical.upper(), physical.upper()
    if sorted(logical) != sorted(physical) or len(set(logical)) != len(logical):
        raise ValueError(
            f"physical order {physical!r} must use the same distinct axis letters as "
            f"logical order {logical!r}"
        )
    return tuple(logical.index(c) for c in physical)


def physical_format(logical: str, physical: str, sharding=None):
    """A format that stores a ``logical``-ordered array as ``physical`` in memory."""
    return layout_format(major_to_minor_for(logical, physical), sharding)


def resolve_formats(spec):
    """``"auto"`` -> an AUTO format for every leaf; ``None`` -> None; else ``spec`` as given."""
    if spec is None:
        return None
    if isinstance(spec, str):
        if spec.lower() != "auto":
            raise ValueError(f"formats must be 'auto', None or Format objects, got {spec!r}")
        return auto_format()
    layout_api()  # fail early and clearly when the API is missing
    return spec


def _compiled_attr(compiled, attr: str):
    if not hasattr(compiled, attr):
        raise LayoutAPIUnavailable(
            f"{type(compiled).__name__} has no '{attr}'; this jax cannot report layouts"
        )
    return getattr(compiled, attr)


def input_formats(compiled):
    """``(args_formats, kwargs_formats)`` chosen by XLA for a compiled function."""
    return _compiled_attr(compiled, layout_api().compiled_inputs)


def output_formats(compiled):
    """The output formats (a pytree like the function's result)."""
    return _compiled_attr(compiled, layout_api().compiled_outputs)


def _local_layout(fmt):
    for attr in ("layout", "device_local_layout"):
        if hasattr(fmt, attr):
            return getattr(fmt, attr)
    return None


def describe_format(fmt) -> dict | None:
    """JSON-ready view: ``{"major_to_minor": [...], "tiling": ..., "sharding": "..."}``."""
    if fmt is None:
        return None
    lay = _local_layout(fmt)
    out: dict[str, Any] = {"sharding": str(getattr(fmt, "sharding", None))}
    if lay is None or lay is layout_api().auto:
        out["major_to_minor"] = "AUTO" if lay is not None else None
        return out
    out["major_to_minor"] = list(getattr(lay, "major_to_minor", ()) or ())
    tiling = getattr(lay, "tiling", None) or getattr(lay, "_tiling", None)
    out["tiling"] = [list(t) for t in tiling] if tiling else None
    return out


class FormatInfo(NamedTuple):
    """One leaf of a compiled function's inputs or outputs."""

    path: str
    shape: tuple[int, ...]
    dtype: str
    major_to_minor: tuple[int, ...] | None
    is_default: bool | None  # row-major, as numpy would store it

    def physical(self, logical: str) -> str | None:
        """``logical`` axis letters (one per dim) in memory order, e.g. ``"NHWC"``."""
        if self.major_to_minor is None or len(logical) != len(self.major_to_minor):
            return None
        return "".join(logical[d] for d in self.major_to_minor)


def _is_format(x) -> bool:
    return x is None or isinstance(x, layout_api().format_cls)


def format_infos(formats, avals) -> list[FormatInfo]:
    """Pair a pytree of formats with the matching avals (``compiled.in_avals``/``out_info``)."""
    tu = jax.tree_util
    fmt_leaves = tu.tree_flatten_with_path(formats, is_leaf=_is_format)[0]
    # Paired by path, not by position: a None in the arguments (an empty subtree, such as a
    # train state without an EMA) is a leaf of the formats (None: no format) but none of the
    # avals, and would shift every pair after it.
    avals_at = {tu.keystr(path): aval for path, aval in tu.tree_flatten_with_path(avals)[0]}
    infos = []
    for path, fmt in fmt_leaves:
        aval = avals_at.get(tu.keystr(path))
        if aval is None:
            continue
        d = describe_format(fmt) or {}
        m2m = d.get("major_to_minor")
        m2m = tuple(m2m) if isinstance(m2m, list) else None
        shape = tuple(getattr(aval, "shape", ()))
        infos.append(
            FormatInfo(
                path=tu.keystr(path),
                shape=shape,
                dtype=str(getattr(aval, "dtype", "?")),
                major_to_minor=m2m,
                is_default=None if m2m is None else m2m == tuple(range(len(shape))),
            )
        )
    return infos


def place_in_formats(compiled, *args, **kwargs):
    """Copy ``args``/``kwargs`` into the formats ``compiled`` expects; returns ``(args, kwargs)``.

    Pass the arguments the compiled function is called with (static arguments left out).
    """
    fmt_args, fmt_kwargs = input_formats(compiled)
    try:
        placed = jax.device_put((tuple(args), dict(kwargs)), (tuple(fmt_args), dict(fmt_kwargs)))
    except ValueError as err:
        raise ValueError(
            "arguments do not match the compiled function's inputs (pass the same pytree "
            f"structure it was lowered with, static arguments left out): {err}"
        ) from err
    return placed
