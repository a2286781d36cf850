"""The model registry: names, what each model expects, and ``create``."""

from __future__ import annotations

import functools
import inspect
import math

import jax
import jax.numpy as jnp
from flax import nnx

from layoutlab.fast_defaults import (
    default_backend,
    fast_compile_options,
    resolve_activation_storage,
    resolve_kernel_storage,
    table_cpu_kind,
)
from layoutlab.layout import Layout, channels_last
from layoutlab.models.registration import (
    POSITIVE,
    PROBABILITY,
    SPECS,
    ModelSpec,
    Range,
    add_spec,
    resolve_layout,
)
from layoutlab.nn.configuration import configure
from layoutlab.nn.conv_algos import default_plan, onednn
from layoutlab.nn.conv_config import check_conv_options, conv_specs, has_depthwise
from layoutlab.nn.conv_settings import ConvSettings
from layoutlab.precision import get_policy

# POSITIVE, PROBABILITY and Range: the argument ranges a registered model may declare.
__all__ = [
    "ModelSpec",
    "POSITIVE",
    "PROBABILITY",
    "Range",
    "cached_when_hashable",
    "create",
    "example_shape",
    "has_depthwise_convs",
    "largest_conv_output",
    "model_compile_options",
    "names",
    "register",
    "resolve_layout",
    "spec",
    "table_runs_onednn",
    "unregister",
]


def _registry() -> dict[str, ModelSpec]:
    # The architecture modules register themselves on import; they are imported on the
    # first lookup, so `import layoutlab.models` (the CLI builds its parser from it) loads
    # no flax.
    from layoutlab.models import cnn3d, mobilenet, resnet, small_cnn, unet, vgg  # noqa: F401

    return SPECS


def register(name: str, **spec_kw):
    """Decorator: add a model (the built-in ones first, so a built-in name is refused)."""

    def wrap(builder):
        _registry()
        add_spec(name, builder, **spec_kw)
        return builder

    return wrap


def unregister(name: str) -> None:
    """Remove a model added with ``register`` (for test-only and experimental models)."""
    spec(name)  # raises with the known names if it is not there
    del _registry()[name.strip().lower()]


def names() -> list[str]:
    return sorted(_registry())


def spec(name: str) -> ModelSpec:
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in _registry():
        raise ValueError(f"Unknown model {name!r}; known models are: {', '.join(names())}.")
    return SPECS[key]


def _accepted_options(builder) -> list[str]:
    target = builder.func if isinstance(builder, functools.partial) else builder
    fn = target.__init__ if isinstance(target, type) else target
    return [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"
    ]


def create(
    name: str,
    *,
    num_classes: int = 10,
    layout: Layout | str = Layout.NHWC,
    policy=None,
    rngs: nnx.Rngs | None = None,
    kernel_storage: str = "auto",
    activation_storage: str = "auto",
    **kw,
) -> nnx.Module:
    """Build a registered model. Extra keywords go to its builder (``stem``, ``width``, ...).

    ``layout`` and ``policy`` may be names (``"NCHW"``, ``"mixed_bf16"``): parsed here, once,
    the layers get the values. ``activation_storage`` becomes the model's ``compute_layout``,
    the layout its layers are built in.

    ``kernel_storage`` and ``activation_storage`` (``nn.configure``) default to
    ``"auto"``, the fast defaults of JAX's default backend (``fast_defaults``): on CPU, conv
    kernels stored ``HWIO`` and a channels-first model computing channels-last inside, with
    the same weights, inputs and outputs as ``"layout"`` for both (the model's own orders).
    """
    s = spec(name)
    kernel_storage = resolve_kernel_storage(kernel_storage)
    activation_storage = resolve_activation_storage(activation_storage)
    check_conv_options(None, kernel_storage, activation_storage)
    # compute_layout is the model's, set from activation_storage below, not an option.
    params = [p for p in _accepted_options(s.builder) if p != "compute_layout"]
    unknown = sorted(set(kw) - set(params))
    if unknown:
        allowed = [p for p in params if p not in ("num_classes", "layout", "policy", "rngs")]
        allowed += ["kernel_storage", "activation_storage"]
        raise ValueError(
            f"Model {s.name!r} got unknown options {unknown}; it accepts: {', '.join(allowed)}."
        )
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}.")
    lay = resolve_layout(layout, s.num_spatial)
    # The activation storage becomes the layout the layers are built in. A registered model
    # without a compute_layout (not an ImageModel) computes in its own layout.
    if "compute_layout" in _accepted_options(s.builder):
        kw["compute_layout"] = (
            channels_last(s.num_spatial) if activation_storage == "channels_last" else lay
        )
    model = s.builder(
        num_classes=num_classes,
        layout=lay,
        policy=get_policy(policy),
        rngs=rngs if rngs is not None else nnx.Rngs(0),
        **kw,
    )
    return configure(model, ConvSettings(kernel_storage=kernel_storage))


def cached_when_hashable(fn):
    """``functools.cache`` of ``fn``, bypassed for arguments that cannot be hashed (a model
    option given as a list, ``--model-arg stage_sizes=[2,2]``): those are computed anew."""
    cached = functools.cache(fn)

    @functools.wraps(fn)
    def call(*args):
        try:
            hash(args)
        except TypeError:
            return fn(*args)
        return cached(*args)

    return call


def _options(model_kwargs: dict | None) -> tuple:
    return tuple(sorted((model_kwargs or {}).items()))


def has_depthwise_convs(name: str, model_kwargs: dict | None = None) -> bool:
    """Whether model ``name`` built with ``model_kwargs`` has depthwise convs (built
    abstractly, once per name and options): the CPU compile options depend on it
    (``fast_defaults.cpu_fast_options``)."""
    return _has_depthwise(name, _options(model_kwargs))


@cached_when_hashable
def _has_depthwise(name: str, items: tuple) -> bool:
    return has_depthwise(nnx.eval_shape(lambda: create(name, **dict(items))))


def example_shape(name: str, image_size=None) -> tuple[int, ...] | None:
    """One example of model ``name`` channels last, ``image_size`` (N, (N,) or (H, W); None:
    the model's default input) filling its spatial axes; None where the size does not fit."""
    s = spec(name)
    if image_size is None:
        return tuple(s.default_input)
    sizes = (image_size,) if isinstance(image_size, int) else tuple(image_size)
    spatial = sizes * s.num_spatial if len(sizes) == 1 else sizes
    return (*spatial, s.default_input[-1]) if len(spatial) == s.num_spatial else None


def largest_conv_output(
    name: str, model_kwargs: dict | None, input_shape: tuple[int, ...]
) -> int | None:
    """Elements of the largest 2D conv output of model ``name`` (built with
    ``model_kwargs``) on one example of ``input_shape`` (channels last, e.g. ``(32, 32, 3)``);
    None when it runs no 2D conv (a 3D model: nothing was measured there). Traced
    abstractly, once per name, options and shape."""
    return _largest_output(name, _options(model_kwargs), tuple(int(d) for d in input_shape))


@cached_when_hashable
def _largest_output(name: str, items: tuple, shape: tuple) -> int | None:
    model = nnx.eval_shape(lambda: create(name, **dict(items)))
    x = jax.ShapeDtypeStruct((1, *shape), jnp.float32)
    sizes = [math.prod(s.out_size) * s.out_features for s in conv_specs(model, x).values()]
    return max(sizes, default=None)


def model_compile_options(
    name: str,
    model_kwargs: dict | None,
    mode: str,
    backend: str | None = None,
    optimizer: str | None = None,
    batch: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    compute_dtype=None,
) -> dict:
    """``fast_defaults.fast_compile_options`` of model ``name``'s ``mode`` step on examples
    of ``input_shape`` (channels last; None: not known) computing in ``compute_dtype`` (a
    policy's; None: not known): they depend on whether it has depthwise convs, on its largest
    conv output and on whether the shipped conv table runs its convs on oneDNN, asked only
    where that can matter (a CPU training step)."""
    backend = backend or default_backend()
    cpu_train = mode == "train" and backend == "cpu"
    depthwise = cpu_train and has_depthwise_convs(name, model_kwargs)
    onednn_convs = (
        cpu_train and compute_dtype is not None and table_runs_onednn(compute_dtype, batch)
    )
    activation = None
    if cpu_train and batch is not None and input_shape is not None:
        try:
            largest = largest_conv_output(name, model_kwargs, input_shape)
        except ValueError:  # a shape the model refuses: the run's own checks say so
            largest = None
        activation = None if largest is None else batch * largest
    return fast_compile_options(
        mode, backend, optimizer, batch, depthwise, activation, onednn_convs=onednn_convs
    )


def table_runs_onednn(compute_dtype, batch: int | None = None) -> bool:
    """Whether the shipped conv table runs the convs of a training step computing in
    ``compute_dtype`` (a policy's) at ``batch`` (None: not known) on oneDNN on this CPU,
    where the extension loaded: on AVX-512 a float32 step from
    ``default_plan.ONEDNN_FLOAT32_TRAIN_MIN_BATCH``, and a bfloat16 one at every batch where
    the CPU has bfloat16 units (``avx512_bf16``), where it has none as a float32 one (its
    convs widened); every conv but a few-channel stem's, a tiny input's and, on a CPU
    without bfloat16 units, the 4x4 512-channel ones (``default_plan.ONEDNN_OVERRIDES``)."""
    kind = table_cpu_kind("cpu")
    if kind is None or not kind.startswith("avx512") or not onednn.available():
        return False
    dtype = jnp.dtype(compute_dtype)
    if dtype == jnp.dtype(jnp.bfloat16):
        if kind not in default_plan.WIDEN_KINDS:
            return kind == "avx512_bf16"
        dtype = jnp.dtype(jnp.float32)  # widened: the float32 rules (default_plan.widened_dtype)
    floor = default_plan.ONEDNN_FLOAT32_TRAIN_MIN_BATCH
    return dtype == jnp.dtype(jnp.float32) and batch is not None and batch >= floor
