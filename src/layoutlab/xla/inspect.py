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
(``nn.configure``): with ``kernel_storage="channels_last"`` a channels-first model keeps
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
from flax import nnx

from layoutlab import models
from layoutlab.fast_defaults import table_cpu_kind
from layoutlab.layout import channels_last
from layoutlab.nn.conv_algos import AUTO, as_plan
from layoutlab.nn.conv_config import (
    check_conv_options,
    convs,
    default_conv_plan,
    plan_coverage,
)
from layoutlab.train.program import Program, build_model, build_program, configure_model
from layoutlab.train.spec import InputSpec, RunSpec, config_for, resolve_spec
from layoutlab.xla.backends import resolve_backend
from layoutlab.xla.compile import compile_report
from layoutlab.xla.formats import LayoutAPIUnavailable, LayoutUnsupportedError
from layoutlab.xla.inspection import ModelInspection
from layoutlab.xla.transpose_kinds import conv_kernel_shapes, count_conv_kernels

__all__ = ["MODES", "build_abstract", "inspect_model", "inspect_spec"]

MODES = ("infer", "train")


# Arguments inspect_model sets itself (compute_layout: from activation_storage).
_RESERVED = frozenset({"layout", "policy", "rngs", "num_classes", "compute_layout"})


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
    reserved = sorted(set(model_kwargs or {}) & _RESERVED)
    if reserved:
        raise ValueError(
            f"model_kwargs may not set {reserved}: pass layout=, precision=, "
            "num_classes= and activation_storage= to inspect_model instead."
        )


def inspect_spec(
    model: str,
    *,
    layout: str = "NHWC",
    precision: str = "fp32",
    batch_size: int = 32,
    image_size: int | tuple[int, ...] | None = None,
    num_classes: int = 10,
    model_kwargs: Mapping | None = None,
    conv_algorithm: str = "xla",
    kernel_storage: str = "layout",
    activation_storage: str = "layout",
    layer_impl: str = "auto",
    conv_plan=None,
    flags: dict | None = None,
    optimizer: str = "train",
    num_steps: int | None = None,
) -> tuple[RunSpec, InputSpec]:
    """The ``RunSpec`` and ``InputSpec`` ``inspect_model`` compiles: the run ``layoutlab train``
    would make of the same settings (its optimizer unless ``optimizer="pytorch"``, its loss-scale
    rule), with ``flags`` as the XLA options of every program and a learning-rate schedule
    over ``num_steps`` optimizer steps (None: ``train.spec.SCHEDULE_STEPS``)."""
    if num_steps is not None and (
        not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 1
    ):
        raise ValueError(f"num_steps (--steps) must be a positive int or None, got {num_steps!r}.")
    s = models.spec(model)
    lay = models.resolve_layout(layout, s.num_spatial)
    spatial = None
    if image_size is not None:  # one size: every spatial axis
        shape = models.example_shape(model, image_size)
        if shape is None:
            raise ValueError(
                f"image_size {image_size!r} does not fit {s.name}, which takes "
                f"{s.num_spatial} spatial sizes (or one for all)."
            )
        spatial = shape[:-1]
    image_shape = s.input_shape(batch_size, channels_last(s.num_spatial), spatial=spatial)[1:]
    plan = as_plan(conv_plan)
    config = config_for(
        optimizer,
        model=s.name,
        model_kwargs=dict(model_kwargs or {}),
        layout=lay.value,
        precision=precision,
        batch_size=batch_size,
        conv_algorithm=conv_algorithm,
        kernel_storage=kernel_storage,
        activation_storage=activation_storage,
        layer_impl=layer_impl,
        conv_plan=plan or None,
        xla_options=dict(flags or {}),
        cpu_fast=False,
        num_steps=num_steps,
    )
    return resolve_spec(config), InputSpec.for_model(s.name, image_shape, num_classes, batch_size)


def build_abstract(spec: RunSpec, inputs: InputSpec, *, table=None):
    """``(program, abstract_state, missing)``: ``spec``'s program and its train state as
    shapes, computing nothing, and for ``"auto"`` convs ``(auto convs without a plan entry
    for their shape, auto convs)`` (else None). ``table=(objective, cpu_kind)``: a spec
    without a plan gets the shipped table's (``nn.conv_config.default_conv_plan``); the
    program's ``spec`` holds the plan that ran.

    Building inside ``jax.eval_shape`` skips the weight initialisation, whose many small
    eager ops would otherwise each be compiled once; only shapes matter to a compile.
    """
    images, _ = inputs.batch(spec.layout)
    missing = None
    if spec.conv_algorithm == AUTO:
        model = nnx.eval_shape(lambda: build_model(spec, inputs))
        if table is not None and not spec.conv_plan and convs(model):
            spec = spec.with_plan(default_conv_plan(model, images, *table))
            model = configure_model(model, spec)
        if any(conv.layout.num_spatial == 2 for _, conv in convs(model)):
            missing = plan_coverage(model, images)
    program = build_program(spec, inputs)
    return program, jax.eval_shape(program.init), missing


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
    layer_impl: str = "auto",
    conv_plan=None,
    optimizer: str = "train",
    num_steps: int | None = None,
) -> ModelInspection:
    """Compile a registry model's forward (``mode="infer"``) or training step (``"train"``)
    ahead of time and report what XLA did with its layouts and precision.

    ``image_size``: one size for every spatial axis, or one per axis (``(H, W)``); None: the
    model's default input.

    ``conv_algorithm`` (``"xla"``, ``"auto"`` or a name from
    ``nn.conv_algos.algorithm_names()``) and ``kernel_storage`` (``"layout"`` or
    ``"channels_last"``) are set on every conv, and ``activation_storage`` (``"layout"`` or
    ``"channels_last"``: an NCHW model computing in NHWC inside) on the model
    (``nn.configure``), before compiling; ``layer_impl`` (``TrainConfig.layer_impl``):
    ``"xla"`` runs every batch norm and max pool on XLA's ops, ``"auto"`` on oneDNN's
    primitive where it applies.
    ``"auto"`` convs run ``conv_plan`` (a ``ConvPlan`` or its dict; None: the shipped
    table's); nothing is autotuned here.

    The model, state and step come from ``train.program.build_program`` of
    ``inspect_spec``'s ``RunSpec``: a training step has the optimizer ``layoutlab train`` runs
    for these settings (AdamW, float32 optimizer state for half-precision params) and its
    loss scale, its schedule over ``num_steps`` (None: ``train.spec.SCHEDULE_STEPS``);
    ``optimizer="pytorch"`` compiles SGD with momentum instead. The report names it and holds
    the spec (``ModelInspection.spec``).
    """
    _check_config(mode, batch_size, image_size, model_kwargs)
    check_conv_options(conv_algorithm, kernel_storage, activation_storage)
    be = resolve_backend(backend)  # fail fast, before anything is built
    s = models.spec(model)
    kwargs = dict(model_kwargs or {})
    if stem is not None:
        kwargs["stem"] = stem
    spec, inputs = inspect_spec(
        s.name,
        layout=layout,
        precision=precision,
        batch_size=batch_size,
        image_size=image_size,
        num_classes=num_classes,
        model_kwargs=kwargs,
        conv_algorithm=conv_algorithm,
        kernel_storage=kernel_storage,
        activation_storage=activation_storage,
        layer_impl=layer_impl,
        conv_plan=conv_plan,
        flags=flags,
        optimizer=optimizer,
        num_steps=num_steps,
    )
    images, labels = inputs.batch(spec.layout)
    t0 = time.perf_counter()
    objective = "train" if mode == "train" else "inference"
    program, state, missing = build_abstract(
        spec, inputs, table=(objective, table_cpu_kind(be.platform))
    )
    spec, plan = program.spec, program.spec.conv_plan
    build_seconds = time.perf_counter() - t0

    fn, args, donate = _step(program, mode, state, images, labels)
    options = spec.compile_options("train" if mode == "train" else "infer") or None

    def compile_with(**formats):
        return compile_report(
            fn, *args, backend=be.name, flags=options, donate_argnums=donate, **formats
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
        layout=spec.layout.value,
        kernel_layout=(
            channels_last(spec.layout.num_spatial).kernel_layout
            if "channels_last" in (kernel_storage, activation_storage)
            else spec.layout.kernel_layout
        ),
        precision=str(precision),
        policy=str(spec.policy),
        mode=mode,
        batch_size=batch_size,
        input_shape=tuple(images.shape),
        model_kwargs=kwargs,
        loss_scale=type(spec.loss_scale).__name__,
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
        conv_plan=as_plan(plan).algorithms() if conv_algorithm == AUTO else None,
        optimizer=spec.optimizer.label if mode == "train" else None,
        spec=spec,
    )


def _step(program: Program, mode: str, state, images, labels):
    """``(fn, args, donate_argnums)`` of the program ``mode`` compiles."""
    if mode == "infer":
        return program.forward, (state, images), ()
    # The state is donated, as a training loop does, so its buffers are reused in place.
    return program.train_step, (state, images, labels), (0,)
