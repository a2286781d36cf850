"""``conv2d``: one 2D conv through a chosen algorithm, in either layout."""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from layoutlab.nn.conv_algos.geometry import (
    ConvSpec,
    kernel_to_hwio,
    make_spec,
    resolve_geometry,
)
from layoutlab.nn.conv_algos.native import native_conv
from layoutlab.nn.conv_algos.plan import PlanEntry
from layoutlab.nn.conv_algos.registry import AUTO, XLA, Algorithm, check_name, get_algorithm
from layoutlab.nn.padding import Padding

__all__ = ["Selection", "conv2d", "conv_spec", "planned_algorithm", "select_algorithm"]


_DEFAULT_KERNEL = {"NHWC": "HWIO", "NCHW": "OIHW"}


class Selection(NamedTuple):
    """What runs for one conv: ``name``, what was asked for, and why they differ."""

    name: str
    requested: str
    reason: str | None


def planned_algorithm(spec: ConvSpec, planned: PlanEntry | None) -> tuple[str, str | None]:
    """``(algorithm, reason)`` an ``"auto"`` conv runs: its plan entry's algorithm when the
    entry was chosen for this very shape, else ``xla`` and why."""
    if planned is None:
        return XLA, "auto: no conv plan entry; using xla"
    if planned.spec_key != spec.key():
        return XLA, (
            f"auto: the plan entry was chosen for {planned.spec_key}, this conv is "
            f"{spec.key()}; using xla"
        )
    return planned.algorithm, None


def _value(name: str, impl: Algorithm | None) -> Algorithm:
    """``impl`` when it is algorithm ``name`` (a conv's captured value), else the table's."""
    return impl if impl is not None and impl.name == name else get_algorithm(name)


def select_algorithm(
    spec: ConvSpec,
    requested: str = XLA,
    planned: PlanEntry | None = None,
    impl: Algorithm | None = None,
) -> Selection:
    """Resolve ``requested`` for ``spec`` (``"auto"``: the ``planned`` entry, see
    ``planned_algorithm``); an algorithm that does not support ``spec`` -> ``xla``.
    ``impl``: the algorithm's value when the caller holds it (a configured ``nn.Conv``),
    so the table is not read."""
    known = impl is not None or requested in (XLA, AUTO)
    asked = requested if known else check_name(requested)
    name, why = planned_algorithm(spec, planned) if asked == AUTO else (asked, None)
    if why is not None:
        return Selection(XLA, asked, why)
    if name == XLA:
        return Selection(XLA, asked, None)
    runs = spec
    if asked == AUTO and _widens(spec, AUTO, planned):
        runs = spec._replace(dtype=planned.compute_dtype)  # a widened conv: conv2d
    reason = _value(name, impl).supports(runs)
    if reason is not None:
        return Selection(XLA, asked, f"{name} does not support {reason}; using xla")
    return Selection(name, asked, None)


def _check_kernel_layout(kernel_layout: str) -> str:
    if sorted(kernel_layout) != sorted("HWIO"):
        raise ValueError(f"kernel_layout must be a permutation of 'HWIO', got {kernel_layout!r}.")
    return kernel_layout


def conv_spec(
    x_shape,
    kernel_shape,
    *,
    strides=1,
    padding: Padding = "SAME",
    dilation=1,
    groups: int = 1,
    layout: str = "NHWC",
    kernel_layout: str | None = None,
    dtype="float32",
) -> ConvSpec:
    """The ``ConvSpec`` (and so the autotune key) of a ``conv2d`` call."""
    layout = str(getattr(layout, "value", layout)).upper()
    if layout not in _DEFAULT_KERNEL:
        raise ValueError(f"conv algorithms handle 2D layouts NHWC and NCHW, got {layout!r}.")
    klay = _check_kernel_layout(kernel_layout or _DEFAULT_KERNEL[layout])
    if len(x_shape) != 4 or len(kernel_shape) != 4:
        raise ValueError(
            f"conv2d needs rank-4 input and kernel, got shapes {tuple(x_shape)} and "
            f"{tuple(kernel_shape)}."
        )
    ksize = (kernel_shape[klay.index("H")], kernel_shape[klay.index("W")])
    out = kernel_shape[klay.index("O")]
    spatial = (x_shape[1], x_shape[2]) if layout == "NHWC" else (x_shape[2], x_shape[3])
    geom = resolve_geometry(spatial, ksize, strides, padding, dilation, groups)
    return make_spec(tuple(x_shape), out, geom, dtype, layout)


def conv2d(
    x,
    kernel,
    *,
    strides=1,
    padding: Padding = "SAME",
    dilation=1,
    groups: int = 1,
    layout: str = "NHWC",
    kernel_layout: str | None = None,
    algorithm: str = XLA,
    planned: PlanEntry | None = None,
    impl: Algorithm | None = None,
    preferred_element_type=None,
    out_dtype=None,
):
    """2D conv of ``x`` (``layout`` NHWC or NCHW) and ``kernel`` (``kernel_layout``, by
    default the layout's: HWIO or OIHW) with ``algorithm`` (a registered name, or ``"auto"``:
    the ``planned`` entry when it was chosen for this shape, else ``xla``). ``impl``: the
    algorithm's value (``nn.Conv`` passes the one it captured when configured), read instead
    of the table.

    Custom algorithms take HWIO kernels and NHWC activations; NCHW inputs are transposed in
    and out around them, except for cores that take NCHW themselves (``core.layouts``, the
    composed ones: Winograd reads and writes NCHW without a transpose of its own).

    ``out_dtype``: the dtype the caller casts the result to (None: the result's own). An
    algorithm that ``rounds_once`` writes it directly instead of ``preferred_element_type``.

    ``kernel`` may be in another dtype than ``x`` (a mixed-precision layer's float32
    parameter): it is cast to ``x``'s, except for an algorithm that ``rounds_kernel``, which
    takes a float32 kernel beside bfloat16 activations as it is.

    An ``"auto"`` conv whose ``planned`` entry names a ``compute_dtype`` (a bfloat16 conv on
    a CPU without bfloat16 units: ``default_plan.widened_dtype``) runs the entry's algorithm
    on its operands rounded to ``x``'s dtype and then widened to that one, exactly, and returns
    the dtype the unwidened conv would (``out_dtype``, else ``preferred_element_type``, else
    ``x``'s).
    """
    layout = str(getattr(layout, "value", layout)).upper()
    klay = _check_kernel_layout(kernel_layout or _DEFAULT_KERNEL.get(layout, "HWIO"))
    if not all(isinstance(d, int) for d in x.shape):
        # A symbolic dimension (jax.export with a symbolic batch): no plan entry was chosen
        # for it and the custom algorithms need concrete shapes, so XLA's conv runs.
        kernel = kernel.astype(x.dtype)
        return _native_symbolic(x, kernel, strides, padding, dilation, groups, layout, klay,
                                preferred_element_type)  # fmt: skip
    spec = conv_spec(
        x.shape,
        kernel.shape,
        strides=strides,
        padding=padding,
        dilation=dilation,
        groups=groups,
        layout=layout,
        kernel_layout=klay,
        dtype=x.dtype,
    )
    if _widens(spec, algorithm, planned):
        # Rounded to the conv's dtype first, so the operands are what a half conv multiplies.
        wide = planned.compute_dtype
        y = conv2d(
            x.astype(wide),
            kernel.astype(x.dtype).astype(wide),
            strides=strides,
            padding=padding,
            dilation=dilation,
            groups=groups,
            layout=layout,
            kernel_layout=klay,
            algorithm=AUTO,
            planned=PlanEntry(planned.algorithm, spec._replace(dtype=wide).key()),
            impl=impl,
        )
        # The dtype the same conv returns unwidened: out_dtype, else preferred, else x's.
        if out_dtype is None:
            out_dtype = x.dtype if preferred_element_type is None else preferred_element_type
        return _cast(y, out_dtype)
    chosen = select_algorithm(spec, algorithm, planned, impl)
    value = None if chosen.name == XLA else _value(chosen.name, impl)
    if not (value is not None and value.rounds_kernel and _half_with_float32(x, kernel)):
        kernel = kernel.astype(x.dtype)
    if value is None:
        y = native_conv(x, kernel, spec.geometry, preferred_element_type, (layout, klay, layout))
        return _cast(y, out_dtype)
    core, preferred = value.core, preferred_element_type
    if out_dtype is not None and value.rounds_once:
        preferred = out_dtype
    w = kernel_to_hwio(kernel, klay)
    if layout in getattr(core, "layouts", ("NHWC",)) and layout != "NHWC":
        return _cast(core(x, w, spec.geometry, preferred, layout=layout), out_dtype)
    if layout == "NCHW":
        y = core(jnp.transpose(x, (0, 2, 3, 1)), w, spec.geometry, preferred)
        return _cast(jnp.transpose(y, (0, 3, 1, 2)), out_dtype)
    return _cast(core(x, w, spec.geometry, preferred), out_dtype)


def _widens(spec: ConvSpec, algorithm: str, planned: PlanEntry | None) -> bool:
    """Whether an ``"auto"`` conv runs its entry on operands widened to the entry's
    ``compute_dtype`` (``PlanEntry``): the entry was chosen for this very shape and names
    one."""
    return (
        algorithm == AUTO
        and planned is not None
        and planned.compute_dtype is not None
        and planned.spec_key == spec.key()
        and spec.dtype != planned.compute_dtype
    )


def _half_with_float32(x, kernel) -> bool:
    return x.dtype == jnp.bfloat16 and kernel.dtype == jnp.float32


def _cast(y, dtype):
    return y if dtype is None else y.astype(dtype)


def _native_symbolic(x, kernel, strides, padding, dilation, groups, layout, klay, preferred):
    spatial = tuple(x.shape[1:3] if layout == "NHWC" else x.shape[2:4])
    ksize = (kernel.shape[klay.index("H")], kernel.shape[klay.index("W")])
    geometry = resolve_geometry(spatial, ksize, strides, padding, dilation, groups)
    return native_conv(x, kernel, geometry, preferred, (layout, klay, layout))
