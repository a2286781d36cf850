"""What XLA does to a whole model: one registry model, one layout, one precision, one step.

``inspect_model("resnet18", layout="NCHW", precision="mixed_bf16", mode="train")`` builds the
model and its training state abstractly (shapes only, no weights are computed), lowers and
compiles the inference forward or the full training step ahead of time with
``compile_report``, and reads the result:

- the logical layout the model asked for and, per convolution, the logical layouts written
  in the program (``hlo_before``) next to the physical ones XLA chose (optimized HLO);
- transposes split into *kernel* transposes (an operand or result shaped like a conv kernel
  parameter: the weights, which stay stored in the model's kernel order and so are
  transposed on every call, or their gradients) and *activation* ones, with bytes; copies;
  converts by dtype pair, with bytes. An op XLA duplicated into several fusions counts once
  per copy, as it runs once per copy;
- fusions, XLA's flop and byte counts, the memory analysis, lowering and compile time,
  persistent-cache hit, the flags in force and the device.

``conv_algorithm=`` and ``kernel_storage=`` set every conv's algorithm and kernel order first
(``nn.configure_convs``): with ``kernel_storage="channels_last"`` a channels-first model keeps
its kernels ``HWIO``, and the kernel transposes of every call leave the program.

``auto_layout=True`` compiles a second time with ``Layout.AUTO`` for every input and output
and reports the layouts XLA chose for the parameters and the images, and what that removed.

The result is a ``ModelInspection`` (``xla.inspection``), which pairs the convs with
``xla.conv_rows`` and sorts the transposes with ``xla.transpose_kinds``;
``compare_model_layouts`` (``xla.model_layout_comparison``) inspects both layouts.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import optax

from layoutlab import models
from layoutlab.fast_defaults import table_cpu_kind
from layoutlab.layout import channels_last
from layoutlab.loss_scale import get_loss_scale
from layoutlab.nn.conv_algos import as_plan
from layoutlab.nn.conv_config import (
    check_conv_options,
    configure_convs,
    convs,
    default_conv_plan,
    plan_coverage,
    with_conv_plan,
)
from layoutlab.precision import get_policy
from layoutlab.train.skip import skip_nonfinite
from layoutlab.train.state import create_train_state
from layoutlab.train.steps import make_forward, make_train_step
from layoutlab.xla.backends import resolve_backend
from layoutlab.xla.compile import compile_report
from layoutlab.xla.formats import LayoutAPIUnavailable, LayoutUnsupportedError
from layoutlab.xla.inspection import ModelInspection
from layoutlab.xla.transpose_kinds import conv_kernel_shapes, count_conv_kernels

__all__ = ["MODES", "build_abstract", "default_optimizer", "inspect_model"]

MODES = ("infer", "train")


def _check_config(mode, batch_size, image_size, model_kwargs):
    if mode not in MODES:
        raise ValueError(
            f"Unknown mode {mode!r}; use 'infer' (forward pass) or 'train' (a full training step)."
        )
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
    sizes = (image_size,) if isinstance(image_size, int) else image_size
    if image_size is not None and (
        not isinstance(sizes, (tuple, list))
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes)
    ):
        raise ValueError(
            f"image_size must be a positive int, a tuple of them (H, W) or None, got "
            f"{image_size!r}."
        )
    if model_kwargs is not None and not isinstance(model_kwargs, Mapping):
        raise ValueError(f"model_kwargs must be a dict, got {type(model_kwargs).__name__}.")
    reserved = sorted(set(model_kwargs or {}) & {"layout", "policy", "rngs", "num_classes"})
    if reserved:
        raise ValueError(
            f"model_kwargs may not set {reserved}: pass layout=, precision= and num_classes= "
            "to inspect_model instead."
        )


def build_abstract(
    name,
    layout,
    policy,
    tx,
    loss_scale,
    model_kwargs,
    *,
    conv_algorithm=None,
    kernel_storage=None,
    activation_storage=None,
    images=None,
    conv_plan=None,
    table=None,
):
    """``(defs, abstract_state, missing, plan)``: the model and its train state as shapes,
    computing nothing, and, for ``conv_algorithm="auto"`` with ``images`` given,
    ``(auto convs without a ``conv_plan`` entry for their shape, auto convs)`` (else None).
    ``table=(objective, cpu_kind)``: an empty ``conv_plan`` is replaced by the shipped
    table's (``nn.conv_config.default_conv_plan``), returned as ``plan``.

    Building inside ``jax.eval_shape`` skips the weight initialisation, whose many small
    eager ops would otherwise each be compiled once; only shapes matter to a compile. The
    conv settings are applied before the train state is made, so the state holds the kernels
    in the stored order the compiled program reads.
    """
    box = {"missing": None}

    def build():
        model = models.create(
            name,
            layout=layout,
            policy=policy,
            kernel_storage=kernel_storage,
            activation_storage=activation_storage,
            **model_kwargs,
        )
        configure_convs(model, conv_algorithm)
        if conv_algorithm == "auto":
            plan = conv_plan
            if table is not None and not plan and images is not None and convs(model):
                plan = default_conv_plan(model, images, *table)  # the shipped table
                box["plan"] = plan
            model = with_conv_plan(model, plan)
        if conv_algorithm == "auto" and images is not None and _has_2d_convs(model):
            box["missing"] = plan_coverage(model, images)
        box["defs"], state = create_train_state(model, tx, loss_scale)
        return state

    state = jax.eval_shape(build)
    return box["defs"], state, box["missing"], box.get("plan", conv_plan)


def _has_2d_convs(model) -> bool:
    return any(conv.layout.num_spatial == 2 for _, conv in convs(model))


def default_optimizer() -> optax.GradientTransformation:
    """SGD with momentum 0.9, skipping non-finite steps, as the inspected training step."""
    return skip_nonfinite(optax.sgd(0.1, momentum=0.9))


def inspect_model(
    model: str,
    *,
    layout: str = "NHWC",
    precision: str = "fp32",
    mode: str = "infer",
    batch_size: int = 32,
    image_size: int | tuple[int, ...] | None = None,
    stem: str | None = None,
    backend: str | None = "cpu",
    flags: dict | None = None,
    model_kwargs: dict | None = None,
    auto_layout: bool = False,
    num_classes: int = 10,
    conv_algorithm: str = "xla",
    kernel_storage: str = "layout",
    activation_storage: str = "layout",
    conv_plan=None,
) -> ModelInspection:
    """Compile a registry model's forward (``mode="infer"``) or training step (``"train"``)
    ahead of time and report what XLA did with its layouts and precision.

    ``image_size``: one size for every spatial axis, or one per axis (``(H, W)``); None: the
    model's default input.

    ``conv_algorithm`` (``"xla"``, ``"auto"`` or a name from
    ``nn.conv_algos.algorithm_names()``) and ``kernel_storage`` (``"layout"`` or
    ``"channels_last"``) are set on every conv, and ``activation_storage`` (``"layout"`` or
    ``"channels_last"``: an NCHW model computing in NHWC inside) on the model
    (``nn.configure_convs``), before compiling.
    ``"auto"`` convs run ``conv_plan`` (a ``ConvPlan`` or its dict; None: xla); nothing is
    autotuned here.
    """
    plan = as_plan(conv_plan)
    _check_config(mode, batch_size, image_size, model_kwargs)
    check_conv_options(conv_algorithm, kernel_storage, activation_storage)
    be = resolve_backend(backend)  # fail fast, before anything is built
    s = models.spec(model)
    lay = models.resolve_layout(layout, s.num_spatial)
    policy = get_policy(precision)
    kwargs = dict(model_kwargs or {})
    if stem is not None:
        kwargs["stem"] = stem
    if mode == "train" and s.task != "classification":
        raise ValueError(
            f"mode='train' compiles the classification training step, and {s.name!r} is a "
            f"{s.task} model; inspect it with mode='infer'."
        )
    spatial = None
    if image_size is not None:  # one size: every spatial axis
        spatial = (image_size,) if isinstance(image_size, int) else tuple(image_size)
        spatial = spatial * s.num_spatial if len(spatial) == 1 else spatial
        if len(spatial) != s.num_spatial:
            raise ValueError(
                f"image_size {image_size!r} does not fit {s.name}, which takes "
                f"{s.num_spatial} spatial sizes (or one for all)."
            )
    shape = s.input_shape(batch_size, lay, spatial=spatial)
    loss_scale = get_loss_scale("dynamic" if policy.needs_loss_scaling else None)
    tx = default_optimizer()

    images = jax.ShapeDtypeStruct(shape, jnp.float32)
    t0 = time.perf_counter()
    objective = "train" if mode == "train" else "inference"
    defs, state, missing, plan = build_abstract(
        s.name,
        lay,
        policy,
        tx,
        loss_scale,
        dict(kwargs, num_classes=num_classes),
        conv_algorithm=conv_algorithm,
        kernel_storage=kernel_storage,
        activation_storage=activation_storage,
        images=images,
        conv_plan=plan,
        table=(objective, table_cpu_kind(be.platform)),
    )
    plan = as_plan(plan)
    build_seconds = time.perf_counter() - t0

    if mode == "infer":
        fn, args, donate = make_forward(defs), (state, images), ()
    else:
        labels = jax.ShapeDtypeStruct((batch_size,), jnp.int32)
        # The state is donated, as a training loop does, so its buffers are reused in place.
        fn, args, donate = make_train_step(defs, tx), (state, images, labels), (0,)

    def compile_with(**formats):
        return compile_report(
            fn, *args, backend=be.name, flags=flags, donate_argnums=donate, **formats
        )

    report = compile_with()
    auto = auto_error = None
    if auto_layout:
        try:
            auto = compile_with(in_formats="auto", out_formats="auto")
        except (LayoutUnsupportedError, LayoutAPIUnavailable) as err:
            auto_error = str(err)
    return ModelInspection(
        model=s.name,
        layout=lay.value,
        kernel_layout=(
            channels_last(lay.num_spatial).kernel_layout
            if "channels_last" in (kernel_storage, activation_storage)
            else lay.kernel_layout
        ),
        precision=str(precision),
        policy=str(policy),
        mode=mode,
        batch_size=batch_size,
        input_shape=tuple(shape),
        model_kwargs=kwargs,
        loss_scale=type(loss_scale).__name__,
        num_conv_kernels=count_conv_kernels(state.params),
        build_seconds=build_seconds,
        report=report,
        auto=auto,
        auto_error=auto_error,
        kernel_shapes=conv_kernel_shapes(state.params),
        conv_algorithm=conv_algorithm,
        kernel_storage=kernel_storage,
        activation_storage=activation_storage,
        missing_choices=None if missing is None else missing[0],
        conv_shapes=None if missing is None else missing[1],
        conv_plan=plan.algorithms() if conv_algorithm == "auto" else None,
    )
