"""Convolutions in any layout: kernels are stored in the layout's own kernel order.

``Conv(algorithm=...)`` picks how a 2D conv is computed (``layoutlab.nn.conv_algos``); the
default ``"xla"`` is XLA's native convolution. ``Conv(kernel_storage="channels_last")`` keeps
the kernel as ``HWIO`` even in a channels-first model, the order XLA:CPU computes in, so
no kernel transpose runs on each call. Both are a conv's ``ConvSettings``
(``nn.configure`` gives a model new ones).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from layoutlab.layout import Layout, channels_last, convert_kernel
from layoutlab.nn.base import LayoutModule
from layoutlab.nn.conv_algos.algorithm import Algorithm
from layoutlab.nn.conv_algos.dispatch import conv2d, conv_spec
from layoutlab.nn.conv_algos.geometry import ConvSpec
from layoutlab.nn.conv_algos.native import xla_conv
from layoutlab.nn.conv_algos.plan import PlanEntry
from layoutlab.nn.conv_intercept import current_interceptor
from layoutlab.nn.conv_names import AUTO, XLA
from layoutlab.nn.conv_settings import ConvSettings
from layoutlab.nn.dtypes import accumulation_dtype, channel_shape
from layoutlab.nn.init import flat_kaiming_normal_fan_out, flat_uniform
from layoutlab.nn.padding import Padding, normalize_padding, normalize_tuple
from layoutlab.precision import Policy

__all__ = [
    "MATMUL",
    "TRANSPOSE_ALGORITHMS",
    "Conv",
    "ConvTranspose",
    "check_settings",
    "default_kernel_init",
]


MATMUL = "matmul"
TRANSPOSE_ALGORITHMS = (AUTO, XLA, MATMUL)  # ConvTranspose's; see its docstring
# torchvision initialises convs with kaiming_normal(mode="fan_out", relu).
default_kernel_init = flat_kaiming_normal_fan_out


def _bias_init(key, shape, dtype, fan_in):
    # PyTorch's default bias init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(key, shape, dtype, -bound, bound)


class Conv(LayoutModule):
    """N-d convolution; 1D, 2D or 3D follows from the layout (NWC/NCW, NHWC/NCHW, ...).

    The kernel is created in channels-last order (``HWIO``) and then moved to the layout's
    kernel order, so the same ``rngs`` give the same weights in every layout.

    ``algorithm``: ``"xla"`` (default), ``"auto"`` (the conv's plan entry, given by
    ``nn.configure(model, plan)``; none, or one chosen for another shape: ``xla``), a
    name from ``conv_algos.algorithm_names()`` or an ``Algorithm`` value; 2D only, and
    grouped, dilated or unsupported shapes run natively.
    ``kernel_storage``: ``"layout"`` (default, the layout's kernel order, which torch weight
    import and ``convert_layout`` expect) or ``"channels_last"`` (``HWIO`` in every layout).
    Both make the conv's ``settings`` (``ConvSettings``), which only ``nn.configure``
    changes, on a copy.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        kernel_size: int | Sequence[int],
        *,
        strides: int | Sequence[int] = 1,
        padding: Padding = "SAME",
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        use_bias: bool = True,
        layout: Layout = Layout.NHWC,
        policy: Policy | None = None,
        kernel_init=default_kernel_init,
        algorithm: str | Algorithm = XLA,
        kernel_storage: str = "layout",
        rngs: nnx.Rngs,
    ):
        self._set_layout_policy(layout, policy)
        n = self.layout.num_spatial
        settings = ConvSettings.named(algorithm, kernel_storage=kernel_storage)
        # Static, so a jitted step's cache key holds it: new settings are a new trace, and
        # the algorithm is a value (core and supports): tracing reads no table of names.
        self.settings = check_settings(settings, n)
        if in_features % groups or out_features % groups:
            raise ValueError(
                f"Conv: in_features ({in_features}) and out_features ({out_features}) must "
                f"both be divisible by groups ({groups})."
            )
        self.in_features = in_features
        self.out_features = out_features
        self.kernel_size = normalize_tuple(kernel_size, n, "kernel_size")
        self.strides = normalize_tuple(strides, n, "strides")
        self.dilation = normalize_tuple(dilation, n, "dilation")
        self.padding = normalize_padding(padding, n)
        self.groups = groups
        hwio = (*self.kernel_size, in_features // groups, out_features)
        dtype = self.policy.param_dtype
        kernel = kernel_init(rngs.params(), hwio, dtype)
        self.kernel = nnx.Param(convert_kernel(kernel, channels_last(n), self._kernel_layout()))
        fan_in = math.prod(hwio[:-1])
        self.bias = (
            nnx.Param(_bias_init(rngs.params(), (out_features,), dtype, fan_in))
            if use_bias
            else None
        )

    @property
    def algorithm(self) -> str:
        """``"xla"``, ``"auto"`` or the name of the algorithm the conv runs."""
        return self.settings.name

    @property
    def kernel_storage(self) -> str:
        return self.settings.kernel_storage

    @property
    def plan_entry(self) -> PlanEntry | None:
        return self.settings.plan_entry

    def _kernel_layout(self, layout: Layout | None = None) -> Layout:
        """The layout whose kernel order the kernel is stored in."""
        layout = layout or self.layout
        if self.kernel_storage == "channels_last":
            return channels_last(layout.num_spatial)
        return layout

    @property
    def kernel_spec(self) -> str:
        """The stored kernel's axis order, e.g. ``"OIHW"`` or ``"HWIO"``."""
        return self._kernel_layout().kernel_layout

    def _convert_params(self, src: Layout, dst: Layout) -> None:
        self.kernel.set_value(
            convert_kernel(self.kernel[...], self._kernel_layout(src), self._kernel_layout(dst))
        )

    def _set_settings(self, settings: ConvSettings) -> None:
        # For nn.configure, on the copy it returns: the kernel moves to the new storage.
        settings = check_settings(settings, self.layout.num_spatial)
        src = self._kernel_layout()
        self.settings = settings
        dst = self._kernel_layout()
        if dst != src:
            kernel = self.kernel.get_value()

            def move(k):
                return convert_kernel(k, src, dst)

            abstract = isinstance(kernel, jax.ShapeDtypeStruct)  # an nnx.eval_shape model
            self.kernel.set_value(jax.eval_shape(move, kernel) if abstract else move(kernel))

    def _geometry(self) -> dict:
        """The keywords ``conv_spec`` and ``conv2d`` share."""
        return dict(
            strides=self.strides,
            padding=self.padding,
            dilation=self.dilation,
            groups=self.groups,
            layout=self.layout.value,
            kernel_layout=self.kernel_spec,
        )

    def spec(self, x_shape) -> ConvSpec:
        """The ``ConvSpec`` (autotune and plan key) of this 2D conv on input ``x_shape``."""
        return conv_spec(
            x_shape, self.kernel.shape, dtype=self.policy.compute_dtype, **self._geometry()
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        self.layout.check_input(
            x.shape, self.in_features, f"Conv({self.in_features}->{self.out_features})"
        )
        intercept = current_interceptor()
        if intercept is not None:
            return intercept(self, x)
        return self.compute(x)

    def compute(self, x: jax.Array, *, native: bool = False) -> jax.Array:
        """The conv of ``x`` under its settings (``native``: by XLA's conv whatever they say,
        the same shapes and dtypes)."""
        dtype = self.policy.compute_dtype
        two_d = self.layout.num_spatial == 2
        if two_d and not native and self.algorithm != XLA:
            y = conv2d(
                x.astype(dtype),
                # conv2d casts it to ``dtype``, unless the algorithm rounds it itself
                self.kernel[...],
                algorithm=self.algorithm,
                planned=self.plan_entry,
                impl=self.settings.algorithm,
                preferred_element_type=accumulation_dtype(self.policy),
                # no bias to add in float32 first: the result is cast to dtype at once
                out_dtype=dtype if self.bias is None else None,
                **self._geometry(),
            )
        else:
            y = xla_conv(
                x.astype(dtype),
                self.kernel[...].astype(dtype),
                accumulation_dtype(self.policy),
                window_strides=self.strides,
                padding=self.padding,
                rhs_dilation=self.dilation,
                dimension_numbers=(self.layout.value, self.kernel_spec, self.layout.value),
                feature_group_count=self.groups,
            )
        if self.bias is not None:
            bias = self.bias[...].astype(y.dtype)
            y = y + bias.reshape(channel_shape(y.ndim, self.layout.channel_axis, bias.shape[0]))
        return y.astype(dtype)


def check_settings(settings: ConvSettings, num_spatial: int) -> ConvSettings:
    """``settings`` if a ``num_spatial``-D conv can run them (only 2D convs run algorithms)."""
    if not isinstance(settings, ConvSettings):
        raise TypeError(f"a Conv's settings are a ConvSettings, got {settings!r}.")
    if num_spatial != 2 and settings.name not in (XLA, AUTO):
        raise ValueError(
            f"Conv algorithm {settings.name!r} is for 2D convs; a {num_spatial}D conv runs "
            "XLA's native convolution (algorithm='xla')."
        )
    return settings


class ConvTranspose(LayoutModule):
    """Transposed convolution with PyTorch's ``ConvTranspose`` semantics.

    ``padding`` and ``output_padding`` are PyTorch's: the output size is
    ``(n - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1``.
    The kernel is ``(in, out, k...)`` (``IOHW``, as PyTorch stores it) in channels-first
    layouts and ``(k..., in, out)`` (``HWIO``) in channels-last ones.

    ``algorithm``: ``"auto"`` (default) runs ``"matmul"`` where the taps do not overlap
    (stride equal to the kernel, no padding, output padding or dilation: U-Net's 2x2
    stride-2 up-sampling) and ``"xla"`` elsewhere. ``"xla"`` is XLA's conv over the
    stride-dilated input, which on XLA:CPU multiplies the inserted zeros too; ``"matmul"``
    is one dot over the input channels followed by a depth-to-space, the same products
    summed in the same way (docs/performance/measurements.md#conv-algorithms).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        kernel_size: int | Sequence[int],
        *,
        strides: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        output_padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        use_bias: bool = True,
        layout: Layout = Layout.NHWC,
        policy: Policy | None = None,
        kernel_init=None,
        algorithm: str = AUTO,
        rngs: nnx.Rngs,
    ):
        self._set_layout_policy(layout, policy)
        n = self.layout.num_spatial
        self.in_features = in_features
        self.out_features = out_features
        self.kernel_size = normalize_tuple(kernel_size, n, "kernel_size")
        self.strides = normalize_tuple(strides, n, "strides")
        self.padding = normalize_tuple(padding, n, "padding")
        self.output_padding = normalize_tuple(output_padding, n, "output_padding")
        self.dilation = normalize_tuple(dilation, n, "dilation")
        for op, s, d in zip(self.output_padding, self.strides, self.dilation, strict=True):
            if op >= max(s, d):
                raise ValueError(
                    f"ConvTranspose: output_padding {self.output_padding} must be smaller "
                    f"than stride or dilation ({self.strides}, {self.dilation})."
                )
        self.algorithm = self._check_transpose_algorithm(algorithm)
        dtype = self.policy.param_dtype
        hwio = (*self.kernel_size, in_features, out_features)
        # PyTorch computes fan_in of a transposed conv from weight.size(1) = out_features.
        fan_in = out_features * math.prod(self.kernel_size)
        bound = 1.0 / math.sqrt(fan_in)
        init = kernel_init or (lambda k, s, d: flat_uniform(k, s, d, -bound, bound))
        kernel = init(rngs.params(), hwio, dtype)
        self.kernel = nnx.Param(self._from_hwio(kernel))
        self.bias = (
            nnx.Param(_bias_init(rngs.params(), (out_features,), dtype, fan_in))
            if use_bias
            else None
        )

    @property
    def taps_overlap(self) -> bool:
        """Whether an output element gathers more than one input position (``"matmul"``
        needs them not to)."""
        return (
            self.strides != self.kernel_size
            or any(self.padding)
            or any(self.output_padding)
            or any(d != 1 for d in self.dilation)
        )

    def _check_transpose_algorithm(self, algorithm: str) -> str:
        if algorithm not in TRANSPOSE_ALGORITHMS:
            raise ValueError(
                f"Unknown ConvTranspose algorithm {algorithm!r}; use one of "
                f"{', '.join(TRANSPOSE_ALGORITHMS)}."
            )
        if algorithm == MATMUL and self.taps_overlap:
            raise ValueError(
                f"ConvTranspose algorithm 'matmul' needs non-overlapping taps (strides equal "
                f"to the kernel {self.kernel_size}, no padding, output padding or dilation); "
                "use 'auto' or 'xla'."
            )
        return algorithm

    def _kernel_spec(self) -> str:
        spatial = self.layout.kernel_layout.replace("I", "").replace("O", "")
        return spatial + "IO" if self.layout.is_channels_last else "IO" + spatial

    def _from_hwio(self, kernel):
        if self.layout.is_channels_last:
            return kernel
        n = self.layout.num_spatial
        return jnp.transpose(kernel, (n, n + 1, *range(n)))

    def _convert_params(self, src: Layout, dst: Layout) -> None:
        n = src.num_spatial
        k = self.kernel[...]
        if src.is_channels_last:  # (k..., I, O) -> (I, O, k...)
            self.kernel.set_value(jnp.transpose(k, (n, n + 1, *range(n))))
        else:  # (I, O, k...) -> (k..., I, O)
            self.kernel.set_value(jnp.transpose(k, (*range(2, n + 2), 0, 1)))

    def __call__(self, x: jax.Array) -> jax.Array:
        self.layout.check_input(
            x.shape, self.in_features, f"ConvTranspose({self.in_features}->{self.out_features})"
        )
        dtype = self.policy.compute_dtype
        if self.algorithm == MATMUL or (self.algorithm == AUTO and not self.taps_overlap):
            y = self._matmul(x.astype(dtype), self.kernel[...].astype(dtype))
        else:
            y = self._dilated_conv(x.astype(dtype), self.kernel[...].astype(dtype))
        if self.bias is not None:
            bias = self.bias[...].astype(y.dtype)
            y = y + bias.reshape(channel_shape(y.ndim, self.layout.channel_axis, bias.shape[0]))
        return y.astype(dtype)

    def _matmul(self, x: jax.Array, kernel: jax.Array) -> jax.Array:
        # Non-overlapping taps: output position s * i + a is x[i] . kernel[a], so one dot
        # over the input channels gives every (i, a) and a reshape interleaves them.
        n = self.layout.num_spatial
        s, k = "hwdxyz"[:n], "abcuvt"[:n]
        x_spec = f"n{s}i" if self.layout.is_channels_last else f"ni{s}"
        k_spec = f"{k}io" if self.layout.is_channels_last else f"io{k}"
        interleaved = "".join(p + q for p, q in zip(s, k, strict=True))
        out_spec = f"n{interleaved}o" if self.layout.is_channels_last else f"no{interleaved}"
        y = jnp.einsum(
            f"{x_spec},{k_spec}->{out_spec}",
            x,
            kernel,
            preferred_element_type=accumulation_dtype(self.policy),
        )
        sizes = self.layout.spatial_shape(x.shape)
        up = tuple(size * st for size, st in zip(sizes, self.strides, strict=True))
        return y.reshape(self.layout.shape(x.shape[0], self.out_features, up))

    def _dilated_conv(self, x: jax.Array, kernel: jax.Array) -> jax.Array:
        n = self.layout.num_spatial
        spec = self._kernel_spec()
        spatial_axes = tuple(spec.index(c) for c in spec if c not in "IO")
        # A transposed conv is a conv over the stride-dilated input with the kernel flipped.
        kernel = jnp.flip(kernel, axis=spatial_axes)
        pads = tuple(
            (d * (k - 1) - p, d * (k - 1) - p + op)
            for k, p, op, d in zip(
                self.kernel_size, self.padding, self.output_padding, self.dilation, strict=True
            )
        )
        return xla_conv(
            x,
            kernel,
            accumulation_dtype(self.policy),
            window_strides=(1,) * n,
            padding=pads,
            lhs_dilation=self.strides,
            rhs_dilation=self.dilation,
            dimension_numbers=(self.layout.value, spec, self.layout.value),
        )
